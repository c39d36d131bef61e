package k8s_event

import (
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

const subsystem = "k8s_event"

// Reasons a line can be dropped for, as the "reason" label of droppedTotal.
const (
	dropQueueFull = "queue_full" // the listener's hand-off queue was full
	dropEvicted   = "evicted"    // its entry left the cache before its count was written
	dropRejected  = "rejected"   // the API refused the write for good (403, 404, 422, ...)
	dropShutdown  = "shutdown"   // still unwritten when the flush at shutdown ran out of time or tokens
)

var (
	linesVec = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "lines_total",
		Help:      "Counter of log lines captured at an enabled level, by level.",
	}, []string{"level"})

	eventWrites = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "writes_total",
		Help:      "Counter of successful event writes to the Kubernetes API, by reason and verb (create or patch).",
	}, []string{"reason", "verb"})

	throttledTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "throttled_total",
		Help:      "Counter of event writes deferred because the token bucket of their reason was empty; their lines are carried by a later write.",
	}, []string{"reason"})

	aggregatedTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "aggregated_total",
		Help:      "Counter of lines folded into a combined event of their plugin and level, by level.",
	}, []string{"level"})

	droppedVec = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "dropped_total",
		Help:      "Counter of lines that did not and will not reach the Kubernetes API, by reason (queue_full, evicted, rejected, shutdown).",
	}, []string{"reason"})

	apiErrors = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "api_errors_total",
		Help:      "Counter of failed event writes, by HTTP status code (0 when no response arrived).",
	}, []string{"code"})

	pendingLines = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "pending_lines",
		Help:      "Number of captured lines not yet carried by a successful write.",
	})
)

// Counters resolved once, so that the listener pays one atomic add.
var (
	linesTotal       [numLevels]prometheus.Counter
	aggregated       [numLevels]prometheus.Counter
	throttled        [numLevels]prometheus.Counter
	droppedQueueFull = droppedVec.WithLabelValues(dropQueueFull)
)

func init() {
	for l := level(0); l < numLevels; l++ {
		linesTotal[l] = linesVec.WithLabelValues(l.String())
		aggregated[l] = aggregatedTotal.WithLabelValues(l.String())
		throttled[l] = throttledTotal.WithLabelValues(l.reason())
	}
}
