#!/usr/bin/env bash
# bench-against.sh BASE [TURNS] [PATTERN]: the listener micro-benchmarks of
# the work tree against those of commit BASE. Both test binaries are built
# once and run in turns, one run each a turn, so that both share the
# machine's drifts; benchstat then gives medians, intervals and p-values.
# Benchmarks that BASE lacks show on one side only.
set -euo pipefail
base=${1:?usage: hack/bench-against.sh BASE [TURNS] [PATTERN]}
turns=${2:-10}
pattern=${3:-^BenchmarkListener}
benchstat_version=${BENCHSTAT_VERSION:-v0.0.0-20260908200009-22c9c6c9d4da}

root=$(git rev-parse --show-toplevel)
out=$root/bin/bench-against
tree=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"' EXIT
mkdir -p "$out"
rm -f "$out"/*.txt

git -C "$root" worktree add --detach "$tree" "$base" >/dev/null
(cd "$tree" && go test -c -o "$out/base.test" .)
(cd "$root" && go test -c -o "$out/head.test" .)
GOBIN=$out go install "golang.org/x/perf/cmd/benchstat@$benchstat_version"

for turn in $(seq 1 "$turns"); do
	echo "turn $turn of $turns" >&2
	for side in base head; do
		"$out/$side.test" -test.run '^$' -test.bench "$pattern" -test.benchmem -test.count 1 |
			grep '^Benchmark' >>"$out/$side.txt"
	done
done
"$out/benchstat" "base=$out/base.txt" "head=$out/head.txt" | tee "$out/report.txt"
