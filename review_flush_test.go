package k8s_event

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// flushWaiting tells whether a flusher waits for a request in flight to end.
func flushWaiting(p *pipeline) func() bool {
	return func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.requestEnded != nil
	}
}

// TestReviewFlushHonoursRetryAfterOfWriteInHand: "A Retry-After is
// honoured in the flush too ...: a failed write or read is tried again no
// sooner than it asks, and when it asks for longer than the flush has left,
// the event is not tried again and its lines are dropped at the end". A
// writer's create is in flight when stop comes; the flush takes the event
// once that write is back. The write is answered 429 with Retry-After 60 s,
// far past the 2 s flush: the event must not be written again in the flush.
func TestReviewFlushHonoursRetryAfterOfWriteInHand(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	entered, release := holdFirstCreateThen(api, fault{code: 429, retryAfter: 60})
	before := readLedger()
	p.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	worker := make(chan struct{})
	go func() { defer close(worker); p.processNext() }()
	<-entered // the writer's create is in flight

	done := make(chan struct{})
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to wait for the write in hand", flushWaiting(p))
	close(release) // answered 429, Retry-After: 60
	<-worker
	<-done

	d := checkLedger(t, api, before, 1)
	if creates, _ := api.writes(); creates != 1 || len(events(t, api)) != 0 {
		t.Errorf("the write in hand was answered Retry-After 60 s, the flush had 2 s: %d creates, %d events, dropped{shutdown} %v; "+
			"the flush wrote the event again at once, not honouring the Retry-After",
			creates, len(events(t, api)), d.dropped[dropShutdown])
	}
}

// TestReviewEndDecidedDuringFlushIsWritten: "Ends still unwritten at
// shutdown are written in the flush if their bucket has a token." A
// storm's create is in flight when stop comes, and the storm has been quiet
// for longer than QUIET when it is back: the writer that had it in hand
// decides its end, during the flush. The end bucket is full and the API
// answers: the end must be written in the flush, not dropped unsaid.
func TestReviewEndDecidedDuringFlushIsWritten(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, time.Minute))
	entered, release := holdFirstCreateThen(api, fault{})
	before := readLedger()
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	worker := make(chan struct{})
	go func() { defer close(worker); p.processNext() }()
	<-entered // the storm's create is in flight
	clk.Step(2 * time.Minute)

	done := make(chan struct{})
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to wait for the write in hand", flushWaiting(p))
	close(release) // the storm is written; its quiet is long past
	<-worker
	<-done

	checkLedger(t, api, before, 12)
	ends := len(withReasonIn(events(t, api), "CoreDNSErrorEnded"))
	if ends != 1 {
		t.Errorf("%d events, %d ends, %.2f tokens in the end bucket after the flush: the end decided while the flush ran was never written",
			len(events(t, api)), ends, p.buckets[endBucket].TokensAt(clk.Now()))
	}
}

// TestReviewHandedBackTokenGoesToAnEventThatUsesIt: "An event that finds
// the bucket's tokens all held by requests in flight waits as if they will
// be spent; each token that comes back unspent is handed at once to one
// event that waits so." Two requests of the error bucket (BURST 2) are in
// flight. A finds the tokens held; once one of them is spent and the
// bucket refilled, A is written, answered 429 with Retry-After 600 s, and
// waits for that. B then finds the last token held. That request never
// reaches the server: its token must go to B, which waits for it, and B
// be written at once, not to A, which waits out its Retry-After and leaves
// the token unused while B waits a whole refill (300 s). Which waiting
// event is woken is left to chance; the scenario runs 20 times.
func TestReviewHandedBackTokenGoesToAnEventThatUsesIt(t *testing.T) {
	for trial := range 20 {
		p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 2, 64))
		inFlight := func() { // a request of the error bucket leaves, holding a token
			p.mu.Lock()
			defer p.mu.Unlock()
			if _, ok := p.reserve(levelError, nil, clk.Now()); !ok {
				t.Fatal("no token for a request")
			}
		}
		back := func(reached bool) { // a request of the error bucket ends
			p.mu.Lock()
			defer p.mu.Unlock()
			p.spend(levelError, clk.Now(), reached)
		}
		inFlight() // X
		inFlight() // Y
		p.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
		drain(p) // A: both tokens held
		back(true)
		clk.Step(300 * time.Second) // Y reached the server; the bucket refilled one
		api.setFault(func(apiRequest) fault { return fault{code: 429, retryAfter: 600} })
		p.mu.Lock()
		a := p.cache.Values()[0]
		p.mu.Unlock()
		p.sync(a) // A is written: 429, Retry-After 600 s
		api.setFault(nil)
		if creates, _ := api.writes(); creates != 1 {
			t.Fatalf("A's write was not made: %d creates", creates)
		}
		p.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
		drain(p)    // B: the bucket's one token is held by X
		back(false) // X never reached the server: its token is back
		drain(p)

		var b bool
		for _, ev := range events(t, api) {
			b = b || ev.Message == "plugin/errors: upstream B down"
		}
		if !b {
			t.Fatalf("trial %d: X's token came back unspent, B waited for it, the API answers: B is not written, %.2f tokens unused in the bucket; "+
				"the token went to A, which waits for its Retry-After", trial, p.buckets[levelError].TokensAt(clk.Now()))
		}
	}
}

// TestReviewStopHungWritesStallNoOtherBucket: at shutdown "every pending
// event whose bucket has a token is written"; "A write already in flight
// then (one that hangs, say) holds up only its own event"; buckets are per
// reason "so that a flood of one level cannot starve another". Both writers
// are in error creates that get no answer, holding the error bucket's two
// tokens; two more errors wait for those tokens, and a warning is pending,
// its bucket full, the API answering warnings at once. The warning must be
// written in the flush, not dropped as shutdown behind the errors that
// wait for the hung writes.
func TestReviewStopHungWritesStallNoOtherBucket(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 2, 64))
	var inFlight sync.WaitGroup
	inFlight.Add(2)
	client := gatedClient(t, api, func(n int, r *http.Request) bool {
		if n > 2 {
			return true
		}
		inFlight.Done()
		<-r.Context().Done() // no answer until the client gives up
		return false
	})
	p.client.Store(&client)
	before := readLedger()
	p.start()
	p.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	p.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	inFlight.Wait() // both writers are in an error create
	p.observe(ln(levelError, "errors", "upstream C down", clk.Now()))
	p.observe(ln(levelError, "errors", "upstream D down", clk.Now()))
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	start := time.Now()
	p.stop(2 * time.Second)
	took := time.Since(start)

	d := checkLedger(t, api, before, 5)
	warnings := len(withReasonIn(events(t, api), "CoreDNSWarning"))
	if warnings != 1 {
		t.Errorf("stop took %v of its 2 s; %d warning events, dropped{shutdown} %v, %.2f tokens in the warnings' bucket: "+
			"the pending warning was not written while the writers' error creates hung",
			took.Round(time.Millisecond), warnings, d.dropped[dropShutdown], p.buckets[levelWarning].TokensAt(clk.Now()))
	}
}

// TestReviewFlushTakesEvictedWriteInHandOnceBack: at shutdown, "A write
// already in flight then (one that hangs, say) holds up only its own
// event, which the flush takes once it is back"; an evicted event whose
// last write got no answer "stays ... until one more write settles it;
// only a shutdown that comes first leaves it unsettled". The writers have
// A's and C's creates in hand when B evicts A (CACHESIZE 2); stop comes,
// and the flush writes B. A's create then comes back without an answer: A
// waits for one more write, the flush has almost all its 2 s left, the API
// answers and the bucket is full. The flush must take A and write it, not
// drop it as shutdown.
func TestReviewFlushTakesEvictedWriteInHandOnceBack(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 2))
	var entered [3]chan struct{}
	var release [3]chan struct{}
	for i := range entered {
		entered[i], release[i] = make(chan struct{}), make(chan struct{})
	}
	client := gatedClient(t, api, func(n int, _ *http.Request) bool {
		if n <= 2 {
			close(entered[n])
			<-release[n]
		}
		return true
	})
	p.client.Store(&client)
	var lost sync.Once
	before := readLedger()
	p.start()
	p.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	<-entered[1] // A's create is in hand
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	<-entered[2]                                                      // C's create is in hand
	p.observe(ln(levelError, "errors", "upstream B down", clk.Now())) // evicts A

	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to write B", func() bool { return len(events(t, api)) == 1 })
	api.setFault(func(r apiRequest) fault { // A's create gets no answer
		f := fault{}
		lost.Do(func() { f.lost = true })
		return f
	})
	close(release[1])
	// A settles: it waits for one more write, which the flush may make at
	// once, while C's create is still in hand.
	var settled bool
	waitUntil(t, "A to wait for one more write, or have it", func() bool {
		p.mu.Lock()
		settled = settled || len(p.settling) == 1
		p.mu.Unlock()
		return settled || len(withReasonIn(events(t, api), "CoreDNSError")) == 2
	})
	close(release[2]) // C's create is written
	<-done
	took := time.Since(start)

	d := checkLedger(t, api, before, 3)
	var a bool
	for _, ev := range events(t, api) {
		a = a || ev.Message == "plugin/errors: upstream A down"
	}
	if !a {
		t.Errorf("stop took %v of its 2 s: %d events, A is not written, dropped{shutdown} %v, %.2f error tokens left: "+
			"the flush never took the event whose write was in hand once it came back",
			took.Round(time.Millisecond), len(events(t, api)), d.dropped[dropShutdown], p.buckets[levelError].TokensAt(clk.Now()))
	}
}
