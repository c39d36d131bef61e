package k8s_event

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReviewFlushEndNotHeldByHungWriteInHand: at shutdown, "A write
// already in flight then (one that hangs, say) holds up only its own
// event", and "Ends still unwritten at shutdown are written in the flush if
// their bucket has a token." Both writers have a create in hand when stop
// comes: a storm's, answered soon after, and a warning's, which hangs. The
// storm has been quiet for longer than QUIET when its write is back: the
// writer decides its end. The end bucket is full, the API answers, the
// flush has almost all its 2 s left: the end must be written, not held up
// by the other writer's hung create until the time is up.
func TestReviewFlushEndNotHeldByHungWriteInHand(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, time.Minute))
	var entered [3]chan struct{}
	for i := range entered {
		entered[i] = make(chan struct{})
	}
	release := make(chan struct{})
	client := gatedClient(t, api, func(n int, r *http.Request) bool {
		switch n {
		case 1: // the storm's create
			close(entered[1])
			<-release
		case 2: // the warning's create: no answer until the client gives up
			close(entered[2])
			<-r.Context().Done()
		}
		return true
	})
	p.client.Store(&client)
	before := readLedger()
	for range 12 { // all the storm's lines are in its first write
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	p.start()
	<-entered[1]
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	<-entered[2]
	clk.Step(2 * time.Minute)

	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to wait for the writes in hand", flushWaiting(p))
	close(release) // the storm is written; its quiet is long past
	<-done
	took := time.Since(start)

	checkLedger(t, api, before, 13)
	ends := len(withReasonIn(events(t, api), "CoreDNSErrorEnded"))
	if ends != 1 {
		t.Errorf("stop took %v of its 2 s; %d events, %d ends, %.2f tokens in the end bucket: "+
			"the end decided once the storm's write was back was held up by the other writer's hung create and never written",
			took.Round(time.Millisecond), len(events(t, api)), ends, p.buckets[endBucket].TokensAt(clk.Now()))
	}
}

// TestReviewFlushHungFlushWritesStallNoOtherBucket: at shutdown "every
// pending event whose bucket has a token is written", and "an event that
// waits ... is put aside while the others are written"; buckets are per
// reason "so that a flood of one level cannot starve another". Two errors
// and a warning are pending when stop comes; the flush's creates of the two
// errors get no answer. The warning's bucket is full, the API answers
// warnings at once, and the flush has its 2 s: the warning must be written,
// not dropped as shutdown behind the two hung error creates.
func TestReviewFlushHungFlushWritesStallNoOtherBucket(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	var hung sync.WaitGroup
	hung.Add(2)
	client := gatedClient(t, api, func(n int, r *http.Request) bool {
		if writesReason(r, "CoreDNSError") { // the flush's two error creates: no answer until the client gives up
			hung.Done()
			<-r.Context().Done()
		}
		return true
	})
	p.client.Store(&client)
	before := readLedger()
	p.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	p.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	start := time.Now()
	p.stop(2 * time.Second)
	took := time.Since(start)
	hung.Wait()

	d := checkLedger(t, api, before, 3)
	warnings := len(withReasonIn(events(t, api), "CoreDNSWarning"))
	if warnings != 1 {
		t.Errorf("stop took %v of its 2 s; %d warning events, dropped{shutdown} %v, %.2f tokens in the warnings' bucket: "+
			"the pending warning was not written while the flush's own error creates hung",
			took.Round(time.Millisecond), warnings, d.dropped[dropShutdown], p.buckets[levelWarning].TokensAt(clk.Now()))
	}
}

// TestReviewFlushEndNotHeldByRetryAfterOfAnother: at shutdown "an event
// that waits (for a token held in flight, a Retry-After, or the pause
// between its tries) is put aside while the others are written", and "Ends
// still unwritten at shutdown are written in the flush if their bucket has
// a token." Both writers have a create in hand when stop comes: a
// warning's, answered 429 with Retry-After 1 s, and a storm's, answered at
// once, the storm quiet for longer than QUIET: the writer decides its end.
// The warning waits its second; the end bucket is full and the API
// answers: the end must be written while the warning waits, not after it.
func TestReviewFlushEndNotHeldByRetryAfterOfAnother(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, time.Minute))
	entered := [3]chan struct{}{nil, make(chan struct{}), make(chan struct{})}
	release := [3]chan struct{}{nil, make(chan struct{}), make(chan struct{})}
	var mu sync.Mutex
	var warningRetried, endBefore bool
	client := gatedClient(t, api, func(n int, r *http.Request) bool {
		if n <= 2 {
			close(entered[n])
			<-release[n]
			return true
		}
		if r.GetBody == nil {
			return true
		}
		body, _ := r.GetBody()
		b, _ := io.ReadAll(body)
		if strings.Contains(string(b), "slow answers") { // the warning's next try
			var end bool
			for _, ev := range events(t, api) {
				end = end || ev.Reason == "CoreDNSErrorEnded"
			}
			mu.Lock()
			if !warningRetried {
				warningRetried, endBefore = true, end
			}
			mu.Unlock()
		}
		return true
	})
	p.client.Store(&client)
	var first sync.Once
	api.setFault(func(r apiRequest) fault { // the first create answered: the warning's
		f := fault{}
		if r.verb == "create" {
			first.Do(func() { f = fault{code: 429, retryAfter: 1} })
		}
		return f
	})
	before := readLedger()
	for range 12 { // all the storm's lines are in its first write
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	p.start()
	<-entered[1] // the storm's create is in hand
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	<-entered[2] // the warning's create is in hand
	clk.Step(2 * time.Minute)

	done := make(chan struct{})
	go func() { defer close(done); p.stop(3 * time.Second) }()
	waitUntil(t, "the flush to wait for the writes in hand", flushWaiting(p))
	close(release[2]) // the warning: 429, Retry-After 1 s
	waitUntil(t, "the warning to wait for its Retry-After", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.cache.Values() {
			if e.key.level == levelWarning && !e.inflight && !e.asked.IsZero() {
				return true
			}
		}
		return false
	})
	close(release[1]) // the storm is written; its quiet is long past
	<-done

	checkLedger(t, api, before, 13)
	mu.Lock()
	defer mu.Unlock()
	if !warningRetried {
		t.Fatalf("the warning was not tried again in the 3 s flush after its Retry-After of 1 s")
	}
	if !endBefore {
		var ends int
		for _, ev := range events(t, api) {
			if ev.Reason == "CoreDNSErrorEnded" {
				ends++
			}
		}
		t.Errorf("the end, its bucket full, was not written while the warning waited out its Retry-After (%d ends after the flush): "+
			"the end decided at stop waits behind the other event's wait", ends)
	}
}

// TestReviewFlushEndNotHeldByHungEvictedWriteInHand: at shutdown "A write
// already in flight then (one that hangs, say) holds up only its own
// event", and "Ends still unwritten at shutdown are written in the flush if
// their bucket has a token." The writers have a warning's create, which
// hangs, and a storm's in hand when a third event evicts the warning
// (CACHESIZE 2); stop comes, the flush writes the third event, and the
// storm's create is answered, the storm quiet for longer than QUIET: the
// writer decides its end. Nothing else is pending, the end bucket is full,
// the API answers and the flush has almost all its 2 s left: the end must
// be written, not wait for the evicted warning's hung create.
func TestReviewFlushEndNotHeldByHungEvictedWriteInHand(t *testing.T) {
	cfg := quietConfig(100, 100, time.Minute)
	cfg.cacheSize = 2
	p, api, clk := newTestPipeline(t, cfg)
	enteredH, enteredS, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	client := gatedClient(t, api, func(_ int, r *http.Request) bool {
		var b []byte
		if r.GetBody != nil {
			body, _ := r.GetBody()
			b, _ = io.ReadAll(body)
		}
		switch {
		case strings.Contains(string(b), "slow answers"): // no answer until the client gives up
			close(enteredH)
			<-r.Context().Done()
		case strings.Contains(string(b), "upstream unhealthy") && !strings.Contains(string(b), "Ended"):
			close(enteredS)
			<-release
		}
		return true
	})
	p.client.Store(&client)
	before := readLedger()
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	for range 12 { // all the storm's lines are in its first write
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	p.start()
	<-enteredH
	<-enteredS
	p.observe(ln(levelError, "errors", "upstream K down", clk.Now())) // evicts the warning
	clk.Step(2 * time.Minute)

	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to write the third event", func() bool { return len(events(t, api)) == 1 })
	close(release) // the storm is written; its quiet is long past
	<-done
	took := time.Since(start)

	checkLedger(t, api, before, 14)
	ends := len(withReasonIn(events(t, api), "CoreDNSErrorEnded"))
	if ends != 1 {
		t.Errorf("stop took %v of its 2 s; %d events, %d ends, %.2f tokens in the end bucket: "+
			"the end decided once the storm's write was back waited for the evicted warning's hung create and was never written",
			took.Round(time.Millisecond), len(events(t, api)), ends, p.buckets[endBucket].TokensAt(clk.Now()))
	}
}

// writesReason tells whether r writes an event of the reason given. The
// flush sends its requests side by side, so their order on the wire is not
// the order of their events.
func writesReason(r *http.Request, reason string) bool {
	if r.GetBody == nil {
		return false
	}
	body, err := r.GetBody()
	if err != nil {
		return false
	}
	defer body.Close()
	b, _ := io.ReadAll(body)
	return bytes.Contains(b, []byte(`"reason":"`+reason+`"`))
}
