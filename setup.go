package k8s_event

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
)

const pluginName = "k8s_event"

func init() { plugin.Register(pluginName, setup) }

// Defaults and accepted ranges of the rate option.
const (
	defaultQPS       = 1.0 / 300
	defaultBurst     = 25
	defaultCacheSize = 4096

	maxQPS       = 1000.0
	maxBurst     = 10000
	maxCacheSize = 1 << 20
)

// Default and accepted range of quiet: how long a storm has had no new line when its end is said.
const (
	defaultQuiet = 5 * time.Minute
	minQuiet     = time.Second
	maxQuiet     = 24 * time.Hour
)

var defaultLevels = levelSet(1<<levelError | 1<<levelWarning)

// config is what one server block asks for.
type config struct {
	levels    levelSet
	qps       float64
	burst     int
	cacheSize int
	rateSet   bool          // rate was given explicitly
	quiet     time.Duration // 0: storms' ends are not said
	quietSet  bool          // quiet was given explicitly

	fleetQPS   float64 // for all the pods of the workload, per reason; 0: no fleet bound
	fleetBurst int
	fleetSet   bool // fleet was given explicitly
}

func setup(c *caddy.Controller) error {
	cfg, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	inst, err := instanceOf(c).addBlock(cfg, dnsserver.GetConfig(c))
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	if inst != nil {
		// The first block wires the hooks: one set, however many blocks enable k8s_event.
		c.OnStartup(inst.startup)
		c.OnShutdown(inst.shutdown)
		c.OnRestartFailed(inst.restartFailed)
	}
	return nil
}

// parse reads one server block's k8s_event stanza. It has no side effects.
func parse(c *caddy.Controller) (config, error) {
	cfg := config{levels: defaultLevels, qps: defaultQPS, burst: defaultBurst,
		cacheSize: defaultCacheSize, quiet: defaultQuiet}
	seen := false
	for c.Next() {
		if seen {
			return cfg, plugin.ErrOnce
		}
		seen = true
		if args := c.RemainingArgs(); len(args) != 0 {
			return cfg, c.Errf("k8s_event takes no arguments, got %q", strings.Join(args, " "))
		}
		given := map[string]bool{}
		for c.NextBlock() {
			if given[c.Val()] {
				return cfg, c.Errf("%s given twice", c.Val())
			}
			given[c.Val()] = true
			switch c.Val() {
			case "level":
				set, err := parseLevels(c, c.RemainingArgs())
				if err != nil {
					return cfg, err
				}
				cfg.levels = set
			case "rate":
				if err := parseRate(c, c.RemainingArgs(), &cfg); err != nil {
					return cfg, err
				}
				cfg.rateSet = true
			case "fleet":
				if err := parseFleet(c, c.RemainingArgs(), &cfg); err != nil {
					return cfg, err
				}
				cfg.fleetSet = true
			case "quiet":
				quiet, err := parseQuiet(c, c.RemainingArgs())
				if err != nil {
					return cfg, err
				}
				cfg.quiet, cfg.quietSet = quiet, true
			default:
				return cfg, c.Errf("unknown property %q", c.Val())
			}
		}
	}
	return cfg, nil
}

func parseLevels(c *caddy.Controller, args []string) (levelSet, error) {
	if len(args) == 0 {
		return 0, c.Err("level needs at least one of debug, info, warning, error, fatal")
	}
	var set levelSet
	for _, a := range args {
		l := slices.IndexFunc(levelNames[:],
			func(name string) bool { return strings.EqualFold(a, name) })
		if l < 0 {
			return 0, c.Errf("level must be one of debug, info, warning, error, fatal: %q", a)
		}
		set |= 1 << l
	}
	return set, nil
}

func parseRate(c *caddy.Controller, args []string, cfg *config) error {
	if len(args) == 0 || len(args) > 3 {
		return c.Errf("rate takes 1 to 3 values, [QPS] [BURST] [CACHESIZE]: %q", strings.Join(args,
			" "))
	}
	qps, err := parseQPS(c, "rate", args[0])
	if err != nil {
		return err
	}
	cfg.qps = qps
	if len(args) > 1 {
		cfg.burst, err = parseInt(c, "rate BURST", args[1], maxBurst)
	}
	if len(args) > 2 && err == nil {
		cfg.cacheSize, err = parseInt(c, "rate CACHESIZE", args[2], maxCacheSize)
	}
	return err
}

// parseFleet reads `fleet QPS [BURST]`: the bound of all the pods of the workload together, in
// the ranges of rate's QPS and BURST; BURST defaults to rate's default.
func parseFleet(c *caddy.Controller, args []string, cfg *config) error {
	if len(args) == 0 || len(args) > 2 {
		return c.Errf("fleet takes 1 or 2 values, QPS [BURST]: %q", strings.Join(args, " "))
	}
	qps, err := parseQPS(c, "fleet", args[0])
	if err != nil {
		return err
	}
	cfg.fleetQPS, cfg.fleetBurst = qps, defaultBurst
	if len(args) > 1 {
		cfg.fleetBurst, err = parseInt(c, "fleet BURST", args[1], maxBurst)
	}
	return err
}

// parseQPS reads the QPS of option: a number in (0, maxQPS].
func parseQPS(c *caddy.Controller, option, arg string) (float64, error) {
	qps, err := strconv.ParseFloat(arg, 64)
	if err != nil || math.IsNaN(qps) || math.IsInf(qps, 0) || strings.ContainsAny(arg, "_xXpP") {
		return 0, c.Errf("%s QPS must be a number: %q", option, arg)
	}
	if qps <= 0 || qps > maxQPS {
		return 0, c.Errf("%s QPS must be in range (0, %g]: %s", option, maxQPS, arg)
	}
	return qps, nil
}

// parseQuiet reads `quiet DURATION|off`: a Go duration in [1s, 24h], or off (returned as 0).
func parseQuiet(c *caddy.Controller, args []string) (time.Duration, error) {
	if len(args) != 1 {
		return 0, c.Errf("quiet takes one value, a DURATION or off: %q", strings.Join(args, " "))
	}
	if strings.EqualFold(args[0], "off") {
		return 0, nil
	}
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return 0, c.Errf("quiet must be a duration such as 5m, or off: %q", args[0])
	}
	if d < minQuiet || d > maxQuiet {
		return 0, c.Errf("quiet must be in range [%v, %v], or off: %s", minQuiet, maxQuiet, args[0])
	}
	return d, nil
}

func parseInt(c *caddy.Controller, name, arg string, max int) (int, error) {
	n, err := strconv.Atoi(arg)
	if err != nil {
		return 0, c.Errf("%s must be an integer: %q", name, arg)
	}
	if n < 1 || n > max {
		return 0, c.Errf("%s must be in range [1, %d]: %s", name, max, arg)
	}
	return n, nil
}

func (c config) String() string {
	s := fmt.Sprintf("level %s; rate %g %d %d; quiet %s",
		c.levels, c.qps, c.burst, c.cacheSize, quietString(c.quiet))
	if c.fleetQPS > 0 {
		s += fmt.Sprintf("; fleet %g %d", c.fleetQPS, c.fleetBurst)
	}
	return s
}

// quietString is a quiet value as the Corefile says it.
func quietString(d time.Duration) string {
	if d <= 0 {
		return "off"
	}
	return d.String()
}
