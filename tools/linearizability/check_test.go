package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Hand-written histories. Timestamps are small integers; `o(...)` lines are joined into a history.
func history(ops ...string) string {
	return `{"operations": [` + strings.Join(ops, ",\n") + `]}`
}

func checkJSON(t *testing.T, doc string) Verdict {
	t.Helper()
	ops, _, err := ReadHistory(strings.NewReader(doc))
	if err != nil {
		t.Fatalf("history rejected: %v", err)
	}
	return Check(ops, time.Minute)
}

var linearizable = map[string]string{
	"sequential set then get": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok","result":"OK"}`,
		`{"client":0,"op":"get","key":"x","call_ns":20,"return_ns":30,"outcome":"ok","result":"1"}`,
	),
	"get before any write sees nil": history(
		`{"client":0,"op":"get","key":"x","call_ns":0,"return_ns":10,"outcome":"ok","result":null}`,
		`{"client":1,"op":"set","key":"x","arg":"1","call_ns":20,"return_ns":30,"outcome":"ok"}`,
	),
	"concurrent get may see the old value": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":0,"op":"set","key":"x","arg":"2","call_ns":20,"return_ns":50,"outcome":"ok"}`,
		`{"client":1,"op":"get","key":"x","call_ns":25,"return_ns":30,"outcome":"ok","result":"1"}`,
		`{"client":2,"op":"get","key":"x","call_ns":26,"return_ns":40,"outcome":"ok","result":"2"}`,
	),
	"unknown write that took effect": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":0,"outcome":"info"}`,
		`{"client":1,"op":"get","key":"x","call_ns":100,"return_ns":110,"outcome":"ok","result":"1"}`,
	),
	"unknown write that never took effect": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":0,"outcome":"info"}`,
		`{"client":1,"op":"get","key":"x","call_ns":100,"return_ns":110,"outcome":"ok","result":null}`,
	),
	"unknown write that takes effect late": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":0,"outcome":"info"}`,
		`{"client":1,"op":"get","key":"x","call_ns":100,"return_ns":110,"outcome":"ok","result":null}`,
		`{"client":1,"op":"get","key":"x","call_ns":200,"return_ns":210,"outcome":"ok","result":"1"}`,
	),
	"failed write is ignored": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"fail","error":"NOTLEADER 2"}`,
		`{"client":1,"op":"get","key":"x","call_ns":100,"return_ns":110,"outcome":"ok","result":null}`,
	),
	"concurrent increments": history(
		`{"client":0,"op":"incr","key":"c","call_ns":0,"return_ns":50,"outcome":"ok","result":2}`,
		`{"client":1,"op":"incr","key":"c","call_ns":10,"return_ns":40,"outcome":"ok","result":1}`,
		`{"client":2,"op":"incr","key":"c","call_ns":60,"return_ns":70,"outcome":"ok","result":3}`,
		`{"client":2,"op":"get","key":"c","call_ns":80,"return_ns":90,"outcome":"ok","result":"3"}`,
	),
	"unknown increment counted by a later one": history(
		`{"client":0,"op":"incr","key":"c","call_ns":0,"return_ns":0,"outcome":"info"}`,
		`{"client":1,"op":"incr","key":"c","call_ns":10,"return_ns":20,"outcome":"ok","result":2}`,
	),
	"appends and delete": history(
		`{"client":0,"op":"append","key":"a","arg":"x","call_ns":0,"return_ns":10,"outcome":"ok","result":1}`,
		`{"client":1,"op":"append","key":"a","arg":"yz","call_ns":5,"return_ns":30,"outcome":"ok","result":3}`,
		`{"client":0,"op":"get","key":"a","call_ns":40,"return_ns":50,"outcome":"ok","result":"xyz"}`,
		`{"client":0,"op":"del","key":"a","call_ns":60,"return_ns":70,"outcome":"ok","result":1}`,
		`{"client":0,"op":"del","key":"a","call_ns":80,"return_ns":90,"outcome":"ok","result":0}`,
		`{"client":0,"op":"get","key":"a","call_ns":95,"return_ns":99,"outcome":"ok","result":null}`,
	),
	"keys are independent": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":1,"op":"set","key":"y","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":0,"op":"get","key":"y","call_ns":20,"return_ns":30,"outcome":"ok","result":"1"}`,
		`{"client":1,"op":"get","key":"x","call_ns":20,"return_ns":30,"outcome":"ok","result":"1"}`,
	),
}

var notLinearizable = map[string]string{
	"stale read after an acknowledged write": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":1,"op":"get","key":"x","call_ns":20,"return_ns":30,"outcome":"ok","result":null}`,
	),
	"acknowledged write lost": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":0,"op":"set","key":"x","arg":"2","call_ns":20,"return_ns":30,"outcome":"ok"}`,
		`{"client":1,"op":"get","key":"x","call_ns":40,"return_ns":50,"outcome":"ok","result":"1"}`,
	),
	"read of a value never written": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":1,"op":"get","key":"x","call_ns":20,"return_ns":30,"outcome":"ok","result":"7"}`,
	),
	"read of a failed write": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"fail"}`,
		`{"client":1,"op":"get","key":"x","call_ns":20,"return_ns":30,"outcome":"ok","result":"1"}`,
	),
	"reads go back in time": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":0,"op":"set","key":"x","arg":"2","call_ns":20,"return_ns":100,"outcome":"ok"}`,
		`{"client":1,"op":"get","key":"x","call_ns":30,"return_ns":40,"outcome":"ok","result":"2"}`,
		`{"client":2,"op":"get","key":"x","call_ns":50,"return_ns":60,"outcome":"ok","result":"1"}`,
	),
	"duplicate increment": history(
		`{"client":0,"op":"incr","key":"c","call_ns":0,"return_ns":10,"outcome":"ok","result":1}`,
		`{"client":1,"op":"incr","key":"c","call_ns":20,"return_ns":30,"outcome":"ok","result":1}`,
	),
	"lost append": history(
		`{"client":0,"op":"append","key":"a","arg":"x","call_ns":0,"return_ns":10,"outcome":"ok","result":1}`,
		`{"client":1,"op":"append","key":"a","arg":"y","call_ns":20,"return_ns":30,"outcome":"ok","result":2}`,
		`{"client":0,"op":"get","key":"a","call_ns":40,"return_ns":50,"outcome":"ok","result":"y"}`,
	),
	"delete reports a missing key that exists": history(
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":1,"op":"del","key":"x","call_ns":20,"return_ns":30,"outcome":"ok","result":0}`,
	),
	"unknown write cannot explain a read before its call": history(
		`{"client":1,"op":"get","key":"x","call_ns":0,"return_ns":10,"outcome":"ok","result":"1"}`,
		`{"client":0,"op":"set","key":"x","arg":"1","call_ns":20,"return_ns":0,"outcome":"info"}`,
	),
}

func TestLinearizableHistoriesPass(t *testing.T) {
	for name, doc := range linearizable {
		t.Run(name, func(t *testing.T) {
			v := checkJSON(t, doc)
			if v.Result != porcupine.Ok {
				t.Fatalf("got %s, want Ok; violations: %+v", v.Result, v.Illegal)
			}
		})
	}
}

func TestNonLinearizableHistoriesFail(t *testing.T) {
	for name, doc := range notLinearizable {
		t.Run(name, func(t *testing.T) {
			v := checkJSON(t, doc)
			if v.Result != porcupine.Illegal {
				t.Fatalf("got %s, want Illegal", v.Result)
			}
			if len(v.Illegal) != 1 {
				t.Fatalf("want exactly one failing key, got %d", len(v.Illegal))
			}
		})
	}
}

func TestOnlyTheFailingKeyIsReported(t *testing.T) {
	doc := history(
		`{"client":0,"op":"set","key":"good","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":0,"op":"get","key":"good","call_ns":20,"return_ns":30,"outcome":"ok","result":"1"}`,
		`{"client":1,"op":"set","key":"bad","arg":"1","call_ns":0,"return_ns":10,"outcome":"ok"}`,
		`{"client":1,"op":"get","key":"bad","call_ns":20,"return_ns":30,"outcome":"ok","result":"0"}`,
	)
	v := checkJSON(t, doc)
	if v.Result != porcupine.Illegal || len(v.Illegal) != 1 || v.Illegal[0].Key != "bad" {
		t.Fatalf("want key bad alone reported, got %s %+v", v.Result, v.Illegal)
	}
	explanation := v.Illegal[0].Explanation
	for _, want := range []string{"key bad", `get(bad) -> "0"`, "impossible in this state", `leaves the key at "1"`} {
		if !strings.Contains(explanation, want) {
			t.Errorf("explanation lacks %q:\n%s", want, explanation)
		}
	}
}

func TestManyConcurrentClientsOnOneKey(t *testing.T) {
	// 8 clients each increment twice with overlapping intervals; replies 1..16 in real-time
	// compatible order are linearizable, and swapping two non-overlapping replies is not.
	var ops []string
	for i := 0; i < 16; i++ {
		call := int64(i * 10)
		ops = append(ops, opIncr(i%8, call, call+15, i+1))
	}
	if v := checkJSON(t, history(ops...)); v.Result != porcupine.Ok {
		t.Fatalf("got %s, want Ok", v.Result)
	}
	ops[0], ops[15] = opIncr(0, 0, 15, 16), opIncr(7, 150, 165, 1)
	if v := checkJSON(t, history(ops...)); v.Result != porcupine.Illegal {
		t.Fatalf("got %s, want Illegal", v.Result)
	}
}

func opIncr(client int, call, ret int64, result int) string {
	return `{"client":` + itoa(int64(client)) + `,"op":"incr","key":"c","call_ns":` + itoa(call) +
		`,"return_ns":` + itoa(ret) + `,"outcome":"ok","result":` + itoa(int64(result)) + `}`
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
