package main

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"

	"github.com/anishathalye/porcupine"
)

// Register is the sequential state of one key: absent, or present with a value. It is a
// comparable value type, so porcupine's default equality applies.
type Register struct {
	Present bool
	Value   string
}

func (r Register) String() string {
	if !r.Present {
		return "(absent)"
	}
	return strconv.Quote(r.Value)
}

// Step applies one operation to a key's register, like a single Redis server would, and tells
// whether the observed reply is possible. An unknown reply is always possible (the operation
// may have taken effect); the state still changes as if it did.
func Step(state Register, in Input, out Output) (bool, Register) {
	switch in.Kind {
	case KindGet:
		return out.Unknown || (out.Present == state.Present && out.Value == state.Value), state
	case KindSet:
		return true, Register{Present: true, Value: in.Arg}
	case KindAppend:
		next := Register{Present: true, Value: state.Value + in.Arg}
		return out.Unknown || out.Int == int64(len(next.Value)), next
	case KindDel:
		existed := int64(0)
		if state.Present {
			existed = 1
		}
		return out.Unknown || out.Int == existed, Register{}
	case KindIncr:
		current := int64(0)
		if state.Present {
			n, err := strconv.ParseInt(state.Value, 10, 64)
			if err != nil {
				// Redis refuses INCR on a non-integer: an acknowledged one is impossible here, an
				// unknown one had no effect.
				return out.Unknown, state
			}
			current = n
		}
		next := current + 1
		return out.Unknown || out.Int == next, Register{Present: true, Value: strconv.FormatInt(next, 10)}
	}
	return false, state
}

// KVModel is the porcupine model of a key-value store whose keys are independent registers; the
// history is partitioned by key, so each key is checked on its own.
func KVModel() porcupine.Model {
	return porcupine.Model{
		Partition: partitionByKey,
		Init:      func() interface{} { return Register{} },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			return Step(state.(Register), input.(Input), output.(Output))
		},
		Hash: func(state interface{}) uint64 {
			r := state.(Register)
			h := fnv.New64a()
			if r.Present {
				h.Write([]byte{1})
			}
			h.Write([]byte(r.Value))
			return h.Sum64()
		},
		DescribeOperation: func(input, output interface{}) string { return Describe(input.(Input), output.(Output)) },
		DescribeState:     func(state interface{}) string { return state.(Register).String() },
		DescribeOperationMetadata: func(info interface{}) string {
			if info == nil {
				return ""
			}
			return fmt.Sprintf("history operation #%d", info.(int))
		},
	}
}

// Describe renders an operation as it appears in explanations, e.g. `incr(k1) -> 4`.
func Describe(in Input, out Output) string {
	var call string
	switch in.Kind {
	case KindSet, KindAppend:
		call = fmt.Sprintf("%s(%s, %q)", in.Kind, in.Key, in.Arg)
	default:
		call = fmt.Sprintf("%s(%s)", in.Kind, in.Key)
	}
	switch {
	case out.Unknown:
		return call + " -> ? (outcome unknown)"
	case in.Kind == KindGet && !out.Present:
		return call + " -> nil"
	case in.Kind == KindGet:
		return call + " -> " + strconv.Quote(out.Value)
	case in.Kind == KindSet:
		return call + " -> OK"
	default:
		return fmt.Sprintf("%s -> %d", call, out.Int)
	}
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		key := op.Input.(Input).Key
		byKey[key] = append(byKey[key], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}
