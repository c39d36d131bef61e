package k8s_event

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
)

// levelsOf is the set of the given levels.
func levelsOf(ls ...level) levelSet {
	var s levelSet
	for _, l := range ls {
		s |= 1 << l
	}
	return s
}

// parsed is the config parse returns for the given settings.
func parsed(levels levelSet, qps float64, burst, cache int, rateSet bool) config {
	return config{levels: levels, qps: qps, burst: burst, cacheSize: cache, rateSet: rateSet, quiet: defaultQuiet}
}

func TestParse(t *testing.T) {
	defaults := parsed(levelsOf(levelError, levelWarning), 1.0/300, 25, 4096, false)
	withLevels := func(ls ...level) config { c := defaults; c.levels = levelsOf(ls...); return c }
	withQuiet := func(d time.Duration) config { c := defaults; c.quiet, c.quietSet = d, true; return c }
	withFleet := func(qps float64, burst int) config {
		c := defaults
		c.fleetQPS, c.fleetBurst, c.fleetSet = qps, burst, true
		return c
	}

	tests := []struct {
		input              string
		shouldErr          bool
		expectedErrContent []string // the option and the offending value
		expected           config
	}{
		// positive
		{"k8s_event", false, nil, defaults},
		{"k8s_event {\n}", false, nil, defaults},
		{"k8s_event {\nlevel debug\n}", false, nil, withLevels(levelDebug)},
		{"k8s_event {\nlevel info\n}", false, nil, withLevels(levelInfo)},
		{"k8s_event {\nlevel warning\n}", false, nil, withLevels(levelWarning)},
		{"k8s_event {\nlevel error\n}", false, nil, withLevels(levelError)},
		{"k8s_event {\nlevel fatal\n}", false, nil, withLevels(levelFatal)},
		{"k8s_event {\nlevel ERROR\n}", false, nil, withLevels(levelError)},
		{"k8s_event {\nlevel Warning\n}", false, nil, withLevels(levelWarning)},
		{"k8s_event {\nlevel error warning fatal\n}", false, nil, withLevels(levelError, levelWarning, levelFatal)},
		{"k8s_event {\nlevel error error\n}", false, nil, withLevels(levelError)},
		{"k8s_event {\nlevel debug info warning error fatal\n}", false, nil, withLevels(levelDebug, levelInfo, levelWarning, levelError, levelFatal)},
		{"k8s_event {\nrate 1\n}", false, nil, parsed(defaults.levels, 1, 25, 4096, true)},
		{"k8s_event {\nrate 2 50\n}", false, nil, parsed(defaults.levels, 2, 50, 4096, true)},
		{"k8s_event {\nrate 5 100 8192\n}", false, nil, parsed(defaults.levels, 5, 100, 8192, true)},
		{"k8s_event {\nrate 1000 10000 1048576\n}", false, nil, parsed(defaults.levels, 1000, 10000, 1048576, true)},
		{"k8s_event {\nrate 0.001 1 1\n}", false, nil, parsed(defaults.levels, 0.001, 1, 1, true)},
		{"k8s_event {\n\tlevel info error warning\n\trate 0.15 10 1024\n}", false, nil,
			parsed(levelsOf(levelInfo, levelError, levelWarning), 0.15, 10, 1024, true)},
		{"k8s_event {\nrate 0.15 10 1024\nlevel info\n}", false, nil, parsed(levelsOf(levelInfo), 0.15, 10, 1024, true)},
		{"k8s_event {\nquiet 30s\n}", false, nil, withQuiet(30 * time.Second)},
		{"k8s_event {\nquiet 5m\n}", false, nil, withQuiet(5 * time.Minute)},
		{"k8s_event {\nquiet 1s\n}", false, nil, withQuiet(time.Second)},
		{"k8s_event {\nquiet 24h\n}", false, nil, withQuiet(24 * time.Hour)},
		{"k8s_event {\nquiet 1h30m\n}", false, nil, withQuiet(90 * time.Minute)},
		{"k8s_event {\nquiet off\n}", false, nil, withQuiet(0)},
		{"k8s_event {\nquiet OFF\n}", false, nil, withQuiet(0)},
		{"k8s_event {\nlevel error\nquiet 2s\nrate 1\n}", false, nil,
			config{levels: levelsOf(levelError), qps: 1, burst: 25, cacheSize: 4096, rateSet: true, quiet: 2 * time.Second, quietSet: true}},

		// negative: quiet
		{"k8s_event {\nquiet\n}", true, []string{"quiet takes one value", `""`}, config{}},
		{"k8s_event {\nquiet 5m off\n}", true, []string{"quiet takes one value", `"5m off"`}, config{}},
		{"k8s_event {\nquiet 5\n}", true, []string{"quiet must be a duration", `"5"`}, config{}},
		{"k8s_event {\nquiet soon\n}", true, []string{"quiet must be a duration", `"soon"`}, config{}},
		{"k8s_event {\nquiet on\n}", true, []string{"quiet must be a duration", `"on"`}, config{}},
		{"k8s_event {\nquiet 0s\n}", true, []string{"quiet must be in range [1s, 24h0m0s]", ": 0s"}, config{}},
		{"k8s_event {\nquiet -5m\n}", true, []string{"quiet must be in range", ": -5m"}, config{}},
		{"k8s_event {\nquiet 500ms\n}", true, []string{"quiet must be in range", ": 500ms"}, config{}},
		{"k8s_event {\nquiet 25h\n}", true, []string{"quiet must be in range", ": 25h"}, config{}},
		{"k8s_event {\nquiet 5m\nquiet 5m\n}", true, []string{"quiet", "twice"}, config{}},

		// negative: level
		{"k8s_event {\nlevel verbose\n}", true, []string{"level", `"verbose"`}, config{}},
		{"k8s_event {\nlevel error verbose\n}", true, []string{"level", `"verbose"`}, config{}},
		{"k8s_event {\nlevel\n}", true, []string{"level", "at least one"}, config{}},
		{"k8s_event {\nlevel error\nlevel warning\n}", true, []string{"level", "twice"}, config{}},

		// negative: rate, number of values
		{"k8s_event {\nrate\n}", true, []string{"rate", "rate takes 1 to 3 values"}, config{}},
		{"k8s_event {\nrate 1 2 3 9\n}", true, []string{"rate", `"1 2 3 9"`}, config{}},
		{"k8s_event {\nrate 1\nrate 1\n}", true, []string{"rate", "twice"}, config{}},

		// negative: rate, not numbers
		{"k8s_event {\nrate abc\n}", true, []string{"rate QPS", `"abc"`}, config{}},
		{"k8s_event {\nrate 1_000\n}", true, []string{"rate QPS", `"1_000"`}, config{}},
		{"k8s_event {\nrate 0x1p-2\n}", true, []string{"rate QPS", `"0x1p-2"`}, config{}},
		{"k8s_event {\nrate 1 x\n}", true, []string{"rate BURST", `"x"`}, config{}},
		{"k8s_event {\nrate 1 2 y\n}", true, []string{"rate CACHESIZE", `"y"`}, config{}},
		{"k8s_event {\nrate NaN\n}", true, []string{"rate QPS", `"NaN"`}, config{}},
		{"k8s_event {\nrate Inf\n}", true, []string{"rate QPS", `"Inf"`}, config{}},
		{"k8s_event {\nrate -Inf\n}", true, []string{"rate QPS", `"-Inf"`}, config{}},
		{"k8s_event {\nrate 1e309\n}", true, []string{"rate QPS", `"1e309"`}, config{}},

		// negative: rate, QPS out of range
		{"k8s_event {\nrate 0\n}", true, []string{"rate QPS", "(0, 1000]: 0"}, config{}},
		{"k8s_event {\nrate -0\n}", true, []string{"rate QPS", "(0, 1000]: -0"}, config{}},
		{"k8s_event {\nrate 1e-400\n}", true, []string{"rate QPS", "(0, 1000]: 1e-400"}, config{}},
		{"k8s_event {\nrate -1\n}", true, []string{"rate QPS", "(0, 1000]: -1"}, config{}},
		{"k8s_event {\nrate 1000.5\n}", true, []string{"rate QPS", "(0, 1000]: 1000.5"}, config{}},
		{"k8s_event {\nrate 1001\n}", true, []string{"rate QPS", "(0, 1000]: 1001"}, config{}},

		// negative: rate, BURST
		{"k8s_event {\nrate 1 0\n}", true, []string{"rate BURST", "[1, 10000]: 0"}, config{}},
		{"k8s_event {\nrate 1 -1\n}", true, []string{"rate BURST", "[1, 10000]: -1"}, config{}},
		{"k8s_event {\nrate 1 10001\n}", true, []string{"rate BURST", "[1, 10000]: 10001"}, config{}},
		{"k8s_event {\nrate 1 1.5\n}", true, []string{"rate BURST", `"1.5"`}, config{}},

		// negative: rate, CACHESIZE
		{"k8s_event {\nrate 1 25 0\n}", true, []string{"rate CACHESIZE", "[1, 1048576]: 0"}, config{}},
		{"k8s_event {\nrate 1 25 1048577\n}", true, []string{"rate CACHESIZE", "[1, 1048576]: 1048577"}, config{}},
		{"k8s_event {\nrate 1 25 2.5\n}", true, []string{"rate CACHESIZE", `"2.5"`}, config{}},

		// fleet: QPS and BURST in rate's ranges, BURST defaults to rate's default
		{"k8s_event {\nfleet 2\n}", false, nil, withFleet(2, 25)},
		{"k8s_event {\nfleet 0.5 100\n}", false, nil, withFleet(0.5, 100)},
		{"k8s_event {\nfleet 1000 10000\n}", false, nil, withFleet(1000, 10000)},
		{"k8s_event {\nfleet\n}", true, []string{"fleet takes 1 or 2 values", `""`}, config{}},
		{"k8s_event {\nfleet 1 2 3\n}", true, []string{"fleet takes 1 or 2 values", `"1 2 3"`}, config{}},
		{"k8s_event {\nfleet 0\n}", true, []string{"fleet QPS", "(0, 1000]: 0"}, config{}},
		{"k8s_event {\nfleet 1001\n}", true, []string{"fleet QPS", "(0, 1000]: 1001"}, config{}},
		{"k8s_event {\nfleet NaN\n}", true, []string{"fleet QPS", `"NaN"`}, config{}},
		{"k8s_event {\nfleet 0x1\n}", true, []string{"fleet QPS", `"0x1"`}, config{}},
		{"k8s_event {\nfleet 1 0\n}", true, []string{"fleet BURST", "[1, 10000]: 0"}, config{}},
		{"k8s_event {\nfleet 1 10001\n}", true, []string{"fleet BURST", "[1, 10000]: 10001"}, config{}},
		{"k8s_event {\nfleet 1 2.5\n}", true, []string{"fleet BURST", `"2.5"`}, config{}},
		{"k8s_event {\nfleet 1\nfleet 2\n}", true, []string{"fleet given twice"}, config{}},

		// negative: the stanza itself
		{"k8s_event {\nfoo bar\n}", true, []string{"unknown property", `"foo"`}, config{}},
		{"k8s_event extra", true, []string{"k8s_event", `"extra"`}, config{}},
		{"k8s_event a b {\nlevel error\n}", true, []string{"k8s_event", `"a b"`}, config{}},
	}

	for i, test := range tests {
		c := caddy.NewTestController("dns", test.input)
		cfg, err := parse(c)

		if test.shouldErr && err == nil {
			t.Errorf("Test %d: expected error but found none for input %q", i, test.input)
			continue
		}
		if err != nil {
			if !test.shouldErr {
				t.Errorf("Test %d: expected no error but found one for input %q: %v", i, test.input, err)
				continue
			}
			for _, want := range test.expectedErrContent {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Test %d: expected error to contain %q for input %q, got: %v", i, want, test.input, err)
				}
			}
			continue
		}
		if cfg != test.expected {
			t.Errorf("Test %d: input %q: expected %+v (%s), got %+v (%s)", i, test.input, test.expected, test.expected, cfg, cfg)
		}
	}
}

// A rate line with too many values should show them, as every other parse
// error shows the value it refuses.
func TestParseRateTooManyValuesShown(t *testing.T) {
	_, err := parse(caddy.NewTestController("dns", "k8s_event {\nrate 1 2 3 extra\n}"))
	if err == nil || !strings.Contains(err.Error(), "extra") {
		t.Errorf("expected the error to show the extra value %q, got: %v", "extra", err)
	}
}

func TestParseOnce(t *testing.T) {
	for _, input := range []string{
		"k8s_event\nk8s_event",
		"k8s_event {\nlevel error\n}\nk8s_event {\nlevel info\n}",
	} {
		_, err := parse(caddy.NewTestController("dns", input))
		if !errors.Is(err, plugin.ErrOnce) {
			t.Errorf("input %q: expected %v, got %v", input, plugin.ErrOnce, err)
		}
	}
}

func TestAddBlock(t *testing.T) {
	tests := []struct {
		name               string
		blocks             []string
		shouldErr          bool
		expectedErrContent []string
		expected           config // levels, qps, burst and cacheSize; rateSet is in expectedRateSet
		expectedRateSet    bool
	}{
		{
			name:     "levels union",
			blocks:   []string{"k8s_event {\nlevel error\n}", "k8s_event {\nlevel info\n}"},
			expected: parsed(levelsOf(levelError, levelInfo), 1.0/300, 25, 4096, false),
		},
		{
			name:     "default levels and debug",
			blocks:   []string{"k8s_event", "k8s_event {\nlevel debug\n}"},
			expected: parsed(levelsOf(levelError, levelWarning, levelDebug), 1.0/300, 25, 4096, false),
		},
		{
			name:            "rate in the second block only",
			blocks:          []string{"k8s_event {\nlevel error\n}", "k8s_event {\nrate 2 50 100\n}"},
			expected:        parsed(levelsOf(levelError, levelWarning), 2, 50, 100, false),
			expectedRateSet: true,
		},
		{
			name:            "rate in the first block only",
			blocks:          []string{"k8s_event {\nrate 2 50 100\n}", "k8s_event {\nlevel info\n}"},
			expected:        parsed(levelsOf(levelError, levelWarning, levelInfo), 2, 50, 100, false),
			expectedRateSet: true,
		},
		{
			name:            "rate in the middle block only",
			blocks:          []string{"k8s_event", "k8s_event {\nrate 2 50 100\n}", "k8s_event {\nlevel fatal\n}"},
			expected:        parsed(levelsOf(levelError, levelWarning, levelFatal), 2, 50, 100, false),
			expectedRateSet: true,
		},
		{
			name:            "the same rate twice",
			blocks:          []string{"k8s_event {\nrate 2 50 100\n}", "k8s_event {\nrate 2 50 100\n}"},
			expected:        parsed(levelsOf(levelError, levelWarning), 2, 50, 100, false),
			expectedRateSet: true,
		},
		{
			name:               "two different rates",
			blocks:             []string{"k8s_event {\nrate 2 50 100\n}", "k8s_event {\nrate 3 50 100\n}"},
			shouldErr:          true,
			expectedErrContent: []string{"rate 3 50 100", "rate 2 50 100"},
		},
		{
			name:     "quiet in the second block only",
			blocks:   []string{"k8s_event", "k8s_event {\nquiet 30s\n}"},
			expected: config{levels: defaultLevels, qps: defaultQPS, burst: defaultBurst, cacheSize: defaultCacheSize, quiet: 30 * time.Second, quietSet: true},
		},
		{
			name:     "quiet off in the first block only",
			blocks:   []string{"k8s_event {\nquiet off\n}", "k8s_event"},
			expected: config{levels: defaultLevels, qps: defaultQPS, burst: defaultBurst, cacheSize: defaultCacheSize, quiet: 0, quietSet: true},
		},
		{
			name:               "two different quiet values",
			blocks:             []string{"k8s_event {\nquiet 30s\n}", "k8s_event", "k8s_event {\nquiet off\n}"},
			shouldErr:          true,
			expectedErrContent: []string{"quiet off conflicts with quiet 30s"},
		},
		{
			name:               "two different rates after a block without rate",
			blocks:             []string{"k8s_event", "k8s_event {\nrate 2\n}", "k8s_event {\nrate 2 26\n}"},
			shouldErr:          true,
			expectedErrContent: []string{"rate 2 26 4096", "rate 2 25 4096"},
		},
	}

	for _, test := range tests {
		inst := &instance{}
		var err error
		for i, input := range test.blocks {
			cfg, perr := parse(caddy.NewTestController("dns", input))
			if perr != nil {
				t.Fatalf("%s: block %d: %v", test.name, i, perr)
			}
			var got *instance
			got, err = inst.addBlock(cfg, &dnsserver.Config{Zone: "example.org.", Port: "53"})
			if err != nil {
				break
			}
			if i == 0 && got != inst {
				t.Errorf("%s: block 0: expected the instance, got %p", test.name, got)
			}
			if i > 0 && got != nil {
				t.Errorf("%s: block %d: expected nil, got %p", test.name, i, got)
			}
		}

		if test.shouldErr && err == nil {
			t.Errorf("%s: expected error but found none", test.name)
			continue
		}
		if err != nil {
			if !test.shouldErr {
				t.Errorf("%s: expected no error but found one: %v", test.name, err)
				continue
			}
			for _, want := range test.expectedErrContent {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%s: expected error to contain %q, got: %v", test.name, want, err)
				}
			}
			continue
		}
		got := inst.cfg
		got.rateSet = false // checked on its own below
		if got != test.expected {
			t.Errorf("%s: expected %s, got %s", test.name, test.expected, got)
		}
		if inst.cfg.rateSet != test.expectedRateSet {
			t.Errorf("%s: expected rateSet %t, got %t", test.name, test.expectedRateSet, inst.cfg.rateSet)
		}
		if len(inst.blocks) != len(test.blocks) {
			t.Errorf("%s: expected %d blocks, got %d", test.name, len(test.blocks), len(inst.blocks))
		}
	}
}

func TestSetup(t *testing.T) {
	c := caddy.NewTestController("dns", "k8s_event {\nlevel error\nrate 2 50 100\n}")
	if err := setup(c); err != nil {
		t.Fatalf("expected no error, got %v", err)
	}

	// A second server block of the same Corefile joins the same instance.
	c.Dispenser = caddyfile.NewDispenser("Testfile", strings.NewReader("k8s_event {\nlevel info\n}"))
	c.ServerBlockIndex = 1
	if err := setup(c); err != nil {
		t.Fatalf("expected no error, got %v", err)
	}
	inst := instanceOf(c)
	if len(inst.blocks) != 2 {
		t.Errorf("expected 2 blocks, got %d", len(inst.blocks))
	}
	if want := levelsOf(levelError, levelInfo); inst.cfg.levels != want {
		t.Errorf("expected levels %s, got %s", want, inst.cfg.levels)
	}

	// A third one with another rate is refused, and said so by name.
	c.Dispenser = caddyfile.NewDispenser("Testfile", strings.NewReader("k8s_event {\nrate 3\n}"))
	c.ServerBlockIndex = 2
	err := setup(c)
	if err == nil || !strings.HasPrefix(err.Error(), "plugin/k8s_event: ") {
		t.Errorf("expected an error starting with %q, got %v", "plugin/k8s_event: ", err)
	}
}

func TestSetupErrors(t *testing.T) {
	tests := []struct {
		input              string
		expectedErrContent string
	}{
		{"k8s_event {\nlevel verbose\n}", `"verbose"`},
		{"k8s_event {\nrate 0\n}", "rate QPS"},
		{"k8s_event extra", `"extra"`},
		{"k8s_event\nk8s_event", plugin.ErrOnce.Error()},
	}
	for i, test := range tests {
		err := setup(caddy.NewTestController("dns", test.input))
		if err == nil {
			t.Errorf("Test %d: expected error but found none for input %q", i, test.input)
			continue
		}
		if !strings.HasPrefix(err.Error(), "plugin/k8s_event: ") {
			t.Errorf("Test %d: expected error to start with %q, got: %v", i, "plugin/k8s_event: ", err)
		}
		if !strings.Contains(err.Error(), test.expectedErrContent) {
			t.Errorf("Test %d: expected error to contain %q, got: %v", i, test.expectedErrContent, err)
		}
	}
}

// TestAddBlockFleet: fleet is process-wide, as rate is: a block without it takes the one given,
// and two different fleet lines are an error that names both.
func TestAddBlockFleet(t *testing.T) {
	add := func(stanzas ...string) (config, error) {
		inst := &instance{}
		for _, st := range stanzas {
			cfg, err := parse(caddy.NewTestController("dns", st))
			if err != nil {
				return config{}, err
			}
			if _, err := inst.addBlock(cfg, &dnsserver.Config{}); err != nil {
				return config{}, err
			}
		}
		return inst.cfg, nil
	}
	cfg, err := add("k8s_event", "k8s_event {\nfleet 2 50\n}", "k8s_event {\nfleet 2 50\n}")
	if err != nil || cfg.fleetQPS != 2 || cfg.fleetBurst != 50 {
		t.Errorf("fleet %v %v, error %v: want 2 50 taken from the block that gives it", cfg.fleetQPS, cfg.fleetBurst, err)
	}
	_, err = add("k8s_event {\nfleet 2 50\n}", "k8s_event {\nfleet 3\n}")
	if err == nil || !strings.Contains(err.Error(), "fleet 3 25 conflicts with fleet 2 50") {
		t.Errorf("error %v, want the two fleet lines named", err)
	}
}
