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
// combined event anew. A place of the room goes to the member of the most
// lines first: a line of a host never spends a place on a member of fewer
// lines than the host while the host has no event of its own.

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
	var states map[string]uint8 // of the promoter's members before the line
	m.inspect(func(s *scheduler) { states = hs.states(s) })
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
	var err error
	m.inspect(func(s *scheduler) { err = hs.electedFirst(s, host, states) })
	if err != nil {
		return err
	}
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
	w, _ := s.corr.windows.Peek(windowKey{hs.level, hs.plugin})
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

// promoterOf is the promoter of the run's hosts' plugin and level, if any.
func (hs *hosts) promoterOf(s *scheduler) *promoter {
	w, _ := s.corr.windows.Peek(windowKey{hs.level, hs.plugin})
	if w == nil {
		return nil
	}
	return w.promoter
}

// states are the states of the members of the hosts' promoter.
func (hs *hosts) states(s *scheduler) map[string]uint8 {
	out := map[string]uint8{}
	if p := hs.promoterOf(s); p != nil {
		for i := range p.slots {
			out[string(p.slots[i].member[:p.slots[i].n])] = p.slots[i].state
		}
	}
	return out
}

// electedFirst checks that the line of host just taken elected or promoted no other member of
// fewer lines than host, while host has no event of its own.
func (hs *hosts) electedFirst(s *scheduler, host string, before map[string]uint8) error {
	p := hs.promoterOf(s)
	if p == nil {
		return nil
	}
	member := strings.TrimSuffix(host, ".")
	var low int64
	state := uint8(notElected)
	if k := p.find(maphash.String(shapeSeed, member)); p.index[k] != 0 {
		c := &p.slots[p.index[k]-1]
		if c.memberIs(member) {
			low, state = c.low(), c.state
		}
	}
	if state != notElected {
		return nil
	}
	for i := range p.slots {
		c := &p.slots[i]
		m := string(c.member[:c.n])
		if c.state != notElected && before[m] == notElected && m != member && c.low() < low {
			return fmt.Errorf("a line of host %s (%d lines) made %s of %d lines an event of "+
				"its own first", host, low, m, c.low())
		}
	}
	return nil
}
