package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdict is the checker's conclusion about a whole history.
type Verdict struct {
	Result porcupine.CheckResult
	Ops    int
	Keys   int
	// Illegal holds one explanation per key whose operations are not linearizable.
	Illegal []KeyViolation
	// info is porcupine's linearization data, kept for the visualisation.
	info porcupine.LinearizationInfo
}

// KeyViolation explains why one key's history is not linearizable.
type KeyViolation struct {
	Key         string
	Ops         int
	Explanation string
}

// Check checks the history for linearizability, key by key. A timeout of 0 means none; when it
// expires before an answer, the result is porcupine.Unknown.
func Check(ops []Op, timeout time.Duration) Verdict {
	history := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		history[i] = porcupine.Operation{
			ClientId: op.Client,
			Input:    op.In,
			Call:     op.CallNs,
			Output:   op.Out,
			Return:   op.ReturnNs,
			Metadata: op.Index,
		}
	}
	model := KVModel()
	result, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	partitions := partitionByKey(history)
	v := Verdict{Result: result, Ops: len(ops), Keys: len(partitions), info: info}
	if result != porcupine.Illegal {
		return v
	}
	origin := int64(math.MaxInt64)
	for _, op := range ops {
		if op.CallNs < origin {
			origin = op.CallNs
		}
	}
	partials := info.PartialLinearizations()
	for i, partition := range partitions {
		longest := longestPartial(partials[i])
		if len(longest) == len(partition) {
			continue
		}
		key := partition[0].Input.(Input).Key
		v.Illegal = append(v.Illegal, KeyViolation{
			Key:         key,
			Ops:         len(partition),
			Explanation: explain(key, partition, longest, origin),
		})
	}
	return v
}

func longestPartial(partials [][]int) []int {
	var longest []int
	for _, p := range partials {
		if len(p) > len(longest) {
			longest = p
		}
	}
	return longest
}

// explain replays the longest linearizable prefix of one key's history and lists the
// operations that could come next, none of which leads to a complete linearization.
func explain(key string, partition []porcupine.Operation, longest []int, origin int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key %s: not linearizable (%d operations)\n", key, len(partition))
	state := Register{}
	for _, id := range longest {
		_, state = Step(state, partition[id].Input.(Input), partition[id].Output.(Output))
	}
	fmt.Fprintf(&b, "  the longest linearizable prefix orders %d of them and leaves the key at %s", len(longest), state)
	const shown = 5
	if len(longest) > 0 {
		fmt.Fprintf(&b, "; its last steps:\n")
		from := len(longest) - shown
		if from < 0 {
			from = 0
		}
		for _, id := range longest[from:] {
			fmt.Fprintf(&b, "    %s\n", describeOp(partition[id], origin))
		}
	} else {
		fmt.Fprintf(&b, "\n")
	}
	done := make(map[int]bool, len(longest))
	for _, id := range longest {
		done[id] = true
	}
	// An operation can come next if it was called before every remaining operation returned.
	var rest []int
	firstReturn := int64(math.MaxInt64)
	for id, op := range partition {
		if !done[id] {
			rest = append(rest, id)
			if op.Return < firstReturn {
				firstReturn = op.Return
			}
		}
	}
	sort.Slice(rest, func(a, b int) bool { return partition[rest[a]].Call < partition[rest[b]].Call })
	fmt.Fprintf(&b, "  no operation that could come next keeps the history linearizable:\n")
	for _, id := range rest {
		op := partition[id]
		if op.Call > firstReturn {
			break
		}
		fits, _ := Step(state, op.Input.(Input), op.Output.(Output))
		why := "impossible in this state"
		if fits {
			why = "possible here, but then no order fits the remaining operations"
		}
		fmt.Fprintf(&b, "    %s: %s\n", describeOp(op, origin), why)
	}
	return b.String()
}

func describeOp(op porcupine.Operation, origin int64) string {
	ret := "never returned"
	if op.Return != math.MaxInt64 {
		ret = fmt.Sprintf("returned %s", seconds(op.Return-origin))
	}
	return fmt.Sprintf("#%d client %d %s [called %s, %s]", op.Metadata.(int), op.ClientId,
		Describe(op.Input.(Input), op.Output.(Output)), seconds(op.Call-origin), ret)
}

func seconds(ns int64) string {
	return fmt.Sprintf("%.9fs", float64(ns)/1e9)
}
