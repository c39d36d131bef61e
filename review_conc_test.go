package k8s_event

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// gate decides, before a request leaves the client, whether it goes on to
// the fake API (true) or is refused there as a connection refused (false):
// it may block, without any lock of the fake API held, so that several
// requests can be held in flight at once.
type gate func(n int, r *http.Request) bool

// gatedClient is a client of api whose every request first passes gate,
// numbered from 1 in the order they are made; what passes meets api's
// faults as api's own client's requests do.
func gatedClient(t *testing.T, api *fakeAPI, g gate) kubernetes.Interface {
	t.Helper()
	var mu sync.Mutex
	n := 0
	cfg := &rest.Config{
		Host: api.srv.URL,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(req *http.Request) (*http.Response, error) {
				mu.Lock()
				n++
				seq := n
				mu.Unlock()
				if !g(seq, req) {
					api.mu.Lock()
					api.refused++
					api.mu.Unlock()
					return nil, errRefused
				}
				return api.send(rt, req)
			})
		},
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor waits, in real time, for cond, and fails the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestReviewFlushTokenHandedBackIsUsed: "every pending event whose bucket
// has a token is written" at shutdown, and "an event that finds the
// bucket's tokens all held by requests in flight ... is tried at once when
// one of them comes back unspent". In the flush, X's create holds the
// bucket's one token; Y finds it held. X's create never reaches the server
// (connection refused: the token is back), and comes too late in the flush
// to be tried again. The bucket has its token, the API answers, the flush
// has seconds left: Y must be written, not dropped as shutdown.
func TestReviewFlushTokenHandedBackIsUsed(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 1, 64))
	// A failed write is not tried again in what is left of the flush.
	p.flushPause = time.Hour
	entered, release := make(chan struct{}), make(chan struct{})
	client := gatedClient(t, api, func(n int, _ *http.Request) bool {
		if n != 1 {
			return true
		}
		close(entered)
		<-release
		return false // the first create is refused before it reaches the server
	})
	p.client.Store(&client)
	before := readLedger()
	p.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
	p.observe(ln(levelError, "errors", "upstream Y down", clk.Now()))
	throttledBefore := testutil.ToFloat64(throttled[levelError])

	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); p.stop(5 * time.Second) }()
	<-entered // one create holds the token
	waitUntil(t, "the other event to find the token held", func() bool {
		return testutil.ToFloat64(throttled[levelError]) > throttledBefore
	})
	close(release) // the held create is refused: the token is handed back
	<-done
	took := time.Since(start)

	d := checkLedger(t, api, before, 2)
	tokens := p.buckets[levelError].TokensAt(clk.Now())
	if n := len(events(t, api)); n != 1 {
		t.Errorf("after the flush (%v of 5 s): %d events, dropped{shutdown} %v, %.2f tokens left in the bucket: "+
			"the event that found the token held was dropped, not written with the token handed back",
			took.Round(time.Millisecond), n, d.dropped[dropShutdown], tokens)
	}
}

// TestReviewLoweredBurstHandBackWakes: "An event that finds the bucket's
// tokens all held by requests in flight waits as if they will be spent,
// and is tried at once when one of them comes back unspent"; pending
// events land "as far as tokens allow". A reload lowers BURST from 2 to 1
// while A's and B's creates are in flight. A's reaches the server (the
// bucket is empty); C comes and waits as if B's will be spent too: two
// refills. B's never reaches the server and B is gone (evicted, nothing
// unsure): one refill (300 s) gives C its token, and C must be written
// then, not after 600 s.
func TestReviewLoweredBurstHandBackWakes(t *testing.T) {
	const refill = 300 * time.Second
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 2, 1))
	var entered [3]chan struct{}
	var release [3]chan struct{}
	for i := range entered {
		entered[i], release[i] = make(chan struct{}), make(chan struct{})
	}
	client := gatedClient(t, api, func(n int, _ *http.Request) bool {
		if n > 2 {
			return true
		}
		close(entered[n])
		<-release[n]
		return n == 1 // A's create reaches the server, B's is refused
	})
	p.client.Store(&client)
	before := readLedger()

	var writers sync.WaitGroup
	p.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	writers.Add(1)
	go func() { defer writers.Done(); p.processNext() }()
	<-entered[1]
	p.observe(ln(levelError, "errors", "upstream B down", clk.Now())) // evicts A, in flight
	writers.Add(1)
	go func() { defer writers.Done(); p.processNext() }()
	<-entered[2]

	p.apply(testConfig(all, 1.0/300, 1, 1), client) // BURST 2 -> 1, both creates in flight
	close(release[1])                               // A's create is written: the bucket is empty
	waitUntil(t, "A's event", func() bool { return len(events(t, api)) == 1 })
	waitUntil(t, "A's write to be booked", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.reserved[levelError] == 1
	})
	p.observe(ln(levelError, "errors", "upstream C down", clk.Now())) // evicts B, in flight
	drain(p)                                                          // C: no token
	close(release[2])                                                 // B's create is refused: its token is handed back
	writers.Wait()
	drain(p)

	written := func() bool {
		for _, ev := range events(t, api) {
			if strings.Contains(ev.Message, "upstream C down") {
				return true
			}
		}
		return false
	}
	rounds := int((refill + 10*time.Second) / time.Second)
	if !runQueue(p, clk, time.Second, rounds, written) {
		t.Errorf("%v after the bucket emptied, C is not written with %.2f tokens in the bucket: it waits for a token held by a request that handed it back",
			time.Duration(rounds)*time.Second, p.buckets[levelError].TokensAt(clk.Now()))
	}
	checkLedger(t, api, before, 3)
}

// TestReviewStopHungWriteHoldsNoOtherBucket: at shutdown "every pending
// event whose bucket has a token is written ... for at most 5 s"; buckets
// are per reason "so that a flood of one level cannot starve another".
// Both writers are in the middle of error creates that get no answer when
// stop comes; a warning is pending, its bucket full, and the API answers
// warnings at once. The warning must be written in the flush time, not
// dropped as shutdown because the writers' hung requests take all of it.
func TestReviewStopHungWriteHoldsNoOtherBucket(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 3, 64))
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
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	start := time.Now()
	p.stop(2 * time.Second)
	took := time.Since(start)

	d := checkLedger(t, api, before, 3)
	warnings := len(withReasonIn(events(t, api), "CoreDNSWarning"))
	if warnings != 1 {
		t.Errorf("stop took %v of its 2 s; %d warning events, dropped{shutdown} %v, %.2f tokens in the warnings' bucket: "+
			"the pending warning was not written while the writers' error creates hung",
			took.Round(time.Millisecond), warnings, d.dropped[dropShutdown], p.buckets[levelWarning].TokensAt(clk.Now()))
	}
}
