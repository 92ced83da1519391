package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// Kind is the operation a client invoked on one key.
type Kind string

// The operation kinds of the history format (see README.md).
const (
	KindGet    Kind = "get"
	KindSet    Kind = "set"
	KindIncr   Kind = "incr"
	KindAppend Kind = "append"
	KindDel    Kind = "del"
)

// Outcome is what the client learnt about an operation.
type Outcome string

// The outcomes of the history format.
const (
	// OutcomeOk: the operation took effect and Result is its reply.
	OutcomeOk Outcome = "ok"
	// OutcomeFail: the operation certainly did not take effect.
	OutcomeFail Outcome = "fail"
	// OutcomeInfo: the outcome is unknown (timeout, connection lost, -UNKNOWN); the operation
	// may take effect at any time after its call, so it is treated as never returning.
	OutcomeInfo Outcome = "info"
)

// RawOp is one line of the JSON history, as written by the harness.
type RawOp struct {
	Client   int             `json:"client"`
	Op       Kind            `json:"op"`
	Key      string          `json:"key"`
	Arg      *string         `json:"arg,omitempty"`
	CallNs   int64           `json:"call_ns"`
	ReturnNs int64           `json:"return_ns"`
	Outcome  Outcome         `json:"outcome"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
}

// History is the document the checker reads.
type History struct {
	Operations []RawOp `json:"operations"`
}

// Input is a model input: what the client asked for.
type Input struct {
	Kind Kind
	Key  string
	Arg  string
}

// Output is a model output: what the client saw. Unknown marks an `info` operation, whose
// reply is unknown and which may or may not have taken effect.
type Output struct {
	Unknown bool
	// Get: Present tells whether the key existed and Value holds it.
	Present bool
	Value   string
	// Incr, append, del: the integer reply.
	Int int64
}

// Op is a validated operation ready for the model.
type Op struct {
	Index    int // position in the input history, for messages
	Client   int
	In       Input
	Out      Output
	CallNs   int64
	ReturnNs int64 // math.MaxInt64 for an `info` operation
}

// ReadHistory parses and validates a JSON history. `fail` operations are dropped (they did not
// happen) and so are `info` reads (they had no effect); the counts are returned for the summary.
func ReadHistory(r io.Reader) (ops []Op, dropped int, err error) {
	var h History
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, 0, fmt.Errorf("history is not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, 0, fmt.Errorf("history: trailing data after the JSON document")
	}
	for i, raw := range h.Operations {
		op, keep, err := validate(i, raw)
		if err != nil {
			return nil, 0, err
		}
		if keep {
			ops = append(ops, op)
		} else {
			dropped++
		}
	}
	return ops, dropped, nil
}

func validate(i int, raw RawOp) (Op, bool, error) {
	fail := func(format string, args ...any) (Op, bool, error) {
		return Op{}, false, fmt.Errorf("operation %d: %s", i, fmt.Sprintf(format, args...))
	}
	if raw.Client < 0 {
		return fail("negative client id %d", raw.Client)
	}
	if raw.CallNs < 0 {
		return fail("negative call_ns %d", raw.CallNs)
	}
	switch raw.Op {
	case KindGet, KindIncr, KindDel:
		if raw.Arg != nil {
			return fail("%s takes no arg", raw.Op)
		}
	case KindSet, KindAppend:
		if raw.Arg == nil {
			return fail("%s needs an arg", raw.Op)
		}
	default:
		return fail("unknown op %q (expected get, set, incr, append or del)", raw.Op)
	}
	op := Op{Index: i, Client: raw.Client, In: Input{Kind: raw.Op, Key: raw.Key}, CallNs: raw.CallNs}
	if raw.Arg != nil {
		op.In.Arg = *raw.Arg
	}
	switch raw.Outcome {
	case OutcomeFail:
		return op, false, nil
	case OutcomeInfo:
		if raw.Op == KindGet {
			return op, false, nil
		}
		op.Out.Unknown = true
		op.ReturnNs = math.MaxInt64
		return op, true, nil
	case OutcomeOk:
	default:
		return fail("unknown outcome %q (expected ok, fail or info)", raw.Outcome)
	}
	if raw.ReturnNs < raw.CallNs {
		return fail("returns (%d) before its call (%d)", raw.ReturnNs, raw.CallNs)
	}
	op.ReturnNs = raw.ReturnNs
	if err := decodeResult(&op, raw.Result); err != nil {
		return fail("%v", err)
	}
	return op, true, nil
}

func decodeResult(op *Op, result json.RawMessage) error {
	switch op.In.Kind {
	case KindGet:
		if len(result) == 0 || bytes.Equal(result, []byte("null")) {
			return nil
		}
		if err := json.Unmarshal(result, &op.Out.Value); err != nil {
			return fmt.Errorf("get result must be a string or null: %v", err)
		}
		op.Out.Present = true
	case KindSet:
		// The reply is +OK; nothing to check.
	case KindIncr, KindAppend, KindDel:
		if err := json.Unmarshal(result, &op.Out.Int); err != nil || len(result) == 0 {
			return fmt.Errorf("%s result must be an integer, got %q", op.In.Kind, string(result))
		}
	}
	return nil
}
