package k8s_event

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

const subsystem = "k8s_event"

// dropReason is why lines were given up: the "cause" label of dropped_total, not an event reason.
type dropReason uint8

const (
	dropQueueFull dropReason = iota // the listener's hand-off queue was full
	dropEvicted                     // the event left the cache with lines unwritten
	dropShutdown                    // still unwritten when the flush at shutdown ended
	dropThrottled                   // a fatal line found its bucket empty; CoreDNS exits at once
	dropFailed                      // a fatal line's only write failed or timed out
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{"queue_full", "evicted", "shutdown", "throttled",
	"failed"}

var (
	linesVec = counterVec("lines_total", []string{"level"},
		"Counter of log lines captured at an enabled level, by level.")

	eventWrites = counterVec("writes_total", []string{"reason", "verb"},
		"Counter of successful event writes to the Kubernetes API, by reason and verb (create or "+
			"patch).")

	throttledTotal = counterVec("throttled_total", []string{"reason"},
		"Counter of event writes deferred because the token bucket of their reason was empty; "+
			"their lines are carried by a later write.")

	aggregatedTotal = counterVec("aggregated_total", []string{"level"},
		"Counter of lines folded into a combined event of their plugin, level and shape, by level.")

	droppedVec = counterVec("dropped_total", []string{"cause"},
		"Counter of lines that no event write will ever carry, by cause (queue_full, evicted, "+
			"shutdown, throttled, failed).")

	apiErrors = counterVec("api_errors_total", []string{"code"},
		"Counter of failed requests to the Kubernetes API, by HTTP status code (0 when no "+
			"response arrived); the expected answers of api_expected_total are not among them.")

	apiExpected = counterVec("api_expected_total", []string{"code", "outcome"},
		"Counter of error answers of the Kubernetes API that are part of the normal course, by "+
			"HTTP status code and outcome (gone: a patch found the event expired, and it is "+
			"created anew; name_taken: a create found its name in use, and takes another; "+
			"exists: a retried create found the event its unanswered first try made).")

	apiWarnings = counterVec("api_warnings_total", []string{"verb"},
		"Counter of warnings the Kubernetes API sent back with its answers (Warning headers, "+
			"from admission policies and webhooks), by verb (create, patch, list, get); they are "+
			"counted, never logged.")

	endedTotal = counterVec("ended_total", []string{"reason"},
		"Counter of storms that went quiet and whose end the plugin said, by the reason of the "+
			"end event (CoreDNSErrorEnded, CoreDNSWarningEnded).")

	endsForgottenTotal = counterVec("ends_forgotten_total", []string{"reason"},
		"Counter of storm ends decided and never written: forgotten to make room in CACHESIZE, "+
			"which the cached events, the settling ones and the ends waiting share.")

	requestsInFlight = promauto.NewGauge(prometheus.GaugeOpts(opts("requests_in_flight",
		"Number of requests to the Kubernetes API sent and not yet answered or timed out.")))

	requestSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "request_duration_seconds",
		Help: "Histogram of the time requests to the Kubernetes API took, answered or not, " +
			"by verb (create, patch, list, get).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, []string{"verb"})

	heldTotal = promauto.NewCounter(prometheus.CounterOpts(opts("server_held_seconds_total",
		"Counter of the seconds every request of this replica was held back because the API "+
			"server answered 429 Too Many Requests: the Retry-After, at least 1 s, with jitter.")))

	fleetReplicas = promauto.NewGauge(prometheus.GaugeOpts(opts("fleet_replicas",
		"Number of pods of this pod's workload that the fleet option shares its bound "+
			"among (N); 0 while N is not read, or without fleet.")))

	fleetUncounted = promauto.NewGauge(prometheus.GaugeOpts(opts("fleet_uncounted",
		"1 when the fleet option is set and the pods of the workload cannot be counted, "+
			"so that only rate bounds the writes; 0 otherwise.")))

	pendingLines = promauto.NewGauge(prometheus.GaugeOpts(opts("pending_lines",
		"Number of captured lines that no successful write has carried yet and that are not "+
			"dropped.")))
)

func opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: plugin.Namespace, Subsystem: subsystem, Name: name,
		Help: help}
}

func counterVec(name string, labels []string, help string) *prometheus.CounterVec {
	return promauto.NewCounterVec(prometheus.CounterOpts(opts(name, help)), labels)
}

// Counters resolved once, so that the listener pays one atomic add.
var (
	linesTotal   [numLevels]prometheus.Counter
	aggregated   [numLevels]prometheus.Counter
	throttled    [numLevels]prometheus.Counter
	droppedTotal [numDropReasons]prometheus.Counter
	ended        [numLevels]prometheus.Counter // warning and error only
	forgotten    [numLevels]prometheus.Counter // ends, warning and error only
	throttledEnd [numLevels]prometheus.Counter // warning and error only
)

func init() {
	for l := level(0); l < numLevels; l++ {
		linesTotal[l] = linesVec.WithLabelValues(l.String())
		aggregated[l] = aggregatedTotal.WithLabelValues(l.String())
		throttled[l] = throttledTotal.WithLabelValues(l.reason())
	}
	for _, l := range []level{levelWarning, levelError} {
		ended[l] = endedTotal.WithLabelValues(endReason(l))
		forgotten[l] = endsForgottenTotal.WithLabelValues(endReason(l))
		throttledEnd[l] = throttledTotal.WithLabelValues(endReason(l))
	}
	for r := dropReason(0); r < numDropReasons; r++ {
		droppedTotal[r] = droppedVec.WithLabelValues(dropReasonNames[r])
	}
	for l := levelDebug; l < levelFatal; l++ {
		promauto.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: plugin.Namespace, Subsystem: subsystem, Name: "unwritten_age_seconds",
			ConstLabels: prometheus.Labels{"reason": l.reason()},
			Help: "Age of the first line of the oldest event never written, by reason; 0 " +
				"when none waits.",
		}, func() float64 { return delays[l].age() })
		promauto.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: plugin.Namespace, Subsystem: subsystem, Name: "unwritten_bound_seconds",
			ConstLabels: prometheus.Labels{"reason": l.reason()},
			Help: "Longest a new line of a plugin with nothing pending waits to be " +
				"written, by reason, with the plugins now waiting.",
		}, func() float64 { return time.Duration(delays[l].bound.Load()).Seconds() })
	}
}

// pluginAgeKey is a reason and a plugin of coredns_k8s_event_unwritten_plugin_age_seconds.
type pluginAgeKey struct {
	reason level
	plugin string
}

// pluginAges holds, by pluginAgeKey, an *atomic.Int64: the unix nanoseconds of the first line of
// the plugin's oldest event of that reason never written, 0 when none waits. Plugins are few:
// those of the Corefile.
var pluginAges sync.Map

// pluginAge is the since of plugin (as lines name it: "plugin/NAME: ") and reason l.
func pluginAge(l level, plugin string) *atomic.Int64 {
	k := pluginAgeKey{l, plugin}
	if v, ok := pluginAges.Load(k); ok {
		return v.(*atomic.Int64)
	}
	v, _ := pluginAges.LoadOrStore(k, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// pluginAgeCollector shows pluginAges, as ages at the time of the scrape.
type pluginAgeCollector struct{ desc *prometheus.Desc }

func (c pluginAgeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c pluginAgeCollector) Collect(ch chan<- prometheus.Metric) {
	pluginAges.Range(func(k, v any) bool {
		key := k.(pluginAgeKey)
		age := ageOf(v.(*atomic.Int64).Load())
		name := strings.TrimSuffix(strings.TrimPrefix(key.plugin, "plugin/"), ": ")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age,
			key.reason.reason(), name)
		return true
	})
}

func init() {
	prometheus.MustRegister(pluginAgeCollector{prometheus.NewDesc(
		prometheus.BuildFQName(plugin.Namespace, subsystem, "unwritten_plugin_age_seconds"),
		"Age of the first line of the oldest event never written, by reason and plugin; 0 "+
			"when none of the plugin waits.", []string{"reason", "plugin"}, nil)})
}

// delay is what the scheduler shows of its delays for one reason.
type delay struct{ since, bound atomic.Int64 } // unix nanoseconds (0: none), nanoseconds

var delays [numLevels]delay

func (d *delay) age() float64 { return ageOf(d.since.Load()) }

// ageOf is the age of since, unix nanoseconds; 0 for 0.
func ageOf(since int64) float64 {
	if since != 0 {
		return time.Since(time.Unix(0, since)).Seconds()
	}
	return 0
}
