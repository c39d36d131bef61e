package k8s_event

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFlushWaitsForTokenOfWriteInHand: at shutdown "a token it hands back
// unspent goes to an event that waits for it". A writer's create of X is in
// flight at stop and holds the bucket's one token; X has left the cache
// meanwhile, so its lines go if the create fails. Y waits in the flush for
// that token: every flusher then has nothing to do but wait. The create
// never reaches the server: Y is written with the token. And while Y waits
// it is looked at again only when a request ends, not in a loop.
func TestFlushWaitsForTokenOfWriteInHand(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, defaultQPS, 1, 1))
	entered, release := make(chan struct{}), make(chan struct{})
	client := gatedClient(t, api, func(n int, r *http.Request) bool {
		if n > 1 {
			return true
		}
		close(entered)
		<-release
		return false // connection refused: the token is not spent
	})
	p.client.Store(&client)
	before := readLedger()
	p.start()
	p.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
	<-entered
	p.observe(ln(levelError, "errors", "upstream Y down", clk.Now())) // evicts X, in flight
	done := make(chan struct{})
	go func() { defer close(done); p.stop(5 * time.Second) }()
	waitUntil(t, "Y to wait in the flush for the token held by X's create", flushWaiting(p))
	throttledBefore := testutil.ToFloat64(throttled[levelError])
	time.Sleep(20 * time.Millisecond) // Y waits; it must not be tried meanwhile
	tries := testutil.ToFloat64(throttled[levelError]) - throttledBefore
	close(release)
	<-done

	if tries > 0 {
		t.Errorf("Y was tried %v times while the token it waits for was held", tries)
	}
	evs := events(t, api)
	if len(evs) != 1 || !strings.Contains(evs[0].Message, "upstream Y down") {
		t.Errorf("%d events after X's create handed its token back in the flush, want Y's", len(evs))
	}
	d := checkLedger(t, api, before, 2)
	if d.dropped[dropEvicted] != 1 {
		t.Errorf("dropped %v, want X's line as evicted", d.dropped)
	}
}

// TestFlushPausesBetweenTries: in the flush, "failed writes are tried again
// every flushPause": an API server that answers 503, with no Retry-After,
// for the whole of a 1 s flush gets a try every 200 ms, not a stream.
func TestFlushPausesBetweenTries(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusServiceUnavailable} })
	p.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	p.stop(time.Second)
	if creates, _ := api.writes(); creates > 6 {
		t.Errorf("%d creates in a 1 s flush answered 503, want at most 6 (one every 200 ms)", creates)
	}
}
