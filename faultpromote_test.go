package k8s_event

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The stepped fault model's check of promotion (README): a host whose lines
// past its plugin and level's events of their own number promoteAt within
// the last hour becomes an event of its own at that line, unless the room
// of promotions of its plugin and level is spent, or noise filled its
// promoter (then the promise is a share), or the line made its shape's
// combined event anew.

// hosts are the failing hosts of one run: their plugin and level, and the
// times of their lines that went past the events of their own.
type hosts struct {
	rng    *rand.Rand
	plugin string
	level  level
	lines  map[string][]time.Time
}

func newHosts(seed uint64) *hosts {
	r := rand.New(rand.NewPCG(seed, 0x686f7374))
	return &hosts{rng: r, plugin: modelPlugins[r.IntN(len(modelPlugins))],
		level: modelLevels[r.IntN(len(modelLevels))], lines: map[string][]time.Time{}}
}

// hostLines logs up to 3 lines of the run's failing hosts, each checked.
func (m *model) hostLines() error {
	for range m.hosts.rng.IntN(4) {
		if err := m.hostLine(); err != nil {
			return err
		}
	}
	return nil
}

// hostLine logs a timeout of one of two hosts, and checks its promotion.
func (m *model) hostLine() error {
	hs := m.hosts
	host := fmt.Sprintf("db%d.corp.example.", hs.rng.IntN(2))
	text := fmt.Sprintf("%d %s A: i/o timeout", hs.rng.IntN(3), host)
	now := m.clk.Now()
	before := testutil.ToFloat64(aggregated[hs.level])
	switch hs.level {
	case levelError:
		m.h.Error(hs.plugin, text)
	case levelWarning:
		m.h.Warning(hs.plugin, text)
	default:
		m.h.Infof(hs.plugin, "%s", text)
	}
	m.fed++
	m.stats.lines++
	m.h.take()
	m.noteFirst()
	if testutil.ToFloat64(aggregated[hs.level]) == before {
		return nil // an event of its own line, or not captured
	}
	var recent []time.Time
	for _, at := range append(hs.lines[host], now) {
		if now.Sub(at) < budgetWindow {
			recent = append(recent, at)
		}
	}
	hs.lines[host] = recent
	if len(recent) < promoteAt {
		return nil
	}
	var err error
	m.inspect(func(s *scheduler) { err = hs.promoted(s, host, now) })
	return err
}

// promoted checks that host, whose line at now is its promoteAt-th within
// the hour, has an event of its own, or that the promise does not hold.
func (hs *hosts) promoted(s *scheduler, host string, now time.Time) error {
	member := strings.TrimSuffix(host, ".") // a name's member has no root dot
	shapeMade := false
	for k, e := range s.corr.cache.entries {
		if k.level != hs.level || k.plugin != hs.plugin || !k.combined() {
			continue
		}
		if k.member == member {
			hostsPromoted++
			return nil
		}
		shapeMade = shapeMade || k.member == "" && e.first.Equal(now)
	}
	at := now.Sub(s.corr.origin)
	w, _ := s.corr.windows.Peek(windowKey{hs.level, hs.plugin}) // Peek: the check moves no recency
	switch {
	case shapeMade: // the line made its shape's combined event: the next one promotes
	case w == nil || w.promoter == nil || len(w.promoter.slots) >= promoterSlots:
	case w.promoted.spent(at) >= maxPromoted:
	default:
		var low int64
		if k := w.promoter.find(maphash.String(shapeSeed, member)); w.promoter.index[k] != 0 {
			low = w.promoter.slots[w.promoter.index[k]-1].low()
		}
		return fmt.Errorf("host %s of %s at level %v had %d lines past its events of their own "+
			"within the hour (its promoter counts %d), and has no event of its own; cache %d of %d",
			host, hs.plugin, hs.level, len(hs.lines[host]), low, len(s.corr.cache.entries),
			s.set.cacheSize)
	}
	return nil
}

// hostsPromoted counts the promotions the model checked, for its summary.
var hostsPromoted int
