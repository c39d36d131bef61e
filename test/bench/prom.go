package main

import (
	"strconv"
	"strings"
)

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseProm reads the samples of a Prometheus text exposition. Comments and
// lines it cannot read are skipped.
func parseProm(text string) []sample {
	var out []sample
	for _, ln := range strings.Split(text, "\n") {
		ln = strings.TrimSpace(ln)
		if ln == "" || ln[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		i := strings.IndexAny(ln, "{ ")
		if i < 0 {
			continue
		}
		s.name, ln = ln[:i], ln[i:]
		if ln[0] == '{' {
			rest, ok := parseLabels(ln[1:], s.labels)
			if !ok {
				continue
			}
			ln = rest
		}
		fields := strings.Fields(ln)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// parseLabels reads name="value" pairs up to the closing brace and returns
// what follows it.
func parseLabels(s string, into map[string]string) (string, bool) {
	for {
		s = strings.TrimLeft(s, " ,")
		if s == "" {
			return "", false
		}
		if s[0] == '}' {
			return s[1:], true
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return "", false
		}
		name := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var b strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
				continue
			}
			b.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", false
		}
		into[name] = b.String()
		s = s[i+1:]
	}
}

// metrics is a parsed scrape.
type metrics []sample

// sum adds the values of the samples called name whose labels include every
// pair of want ("" as a value matches any value; a value "a|b" matches a or b).
func (m metrics) sum(name string, want ...string) float64 {
	total := 0.0
	for _, s := range m {
		if s.name != name || !matches(s.labels, want) {
			continue
		}
		total += s.value
	}
	return total
}

// byLabel sums the samples called name by the value of one label.
func (m metrics) byLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m {
		if s.name == name {
			out[s.labels[label]] += s.value
		}
	}
	return out
}

func matches(labels map[string]string, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		got, ok := labels[want[i]]
		if !ok {
			return false
		}
		if want[i+1] == "" {
			continue
		}
		hit := false
		for _, alt := range strings.Split(want[i+1], "|") {
			if got == alt {
				hit = true
				break
			}
		}
		if !hit {
			return false
		}
	}
	return true
}
