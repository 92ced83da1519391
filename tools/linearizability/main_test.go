package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runOn(t *testing.T, doc string, extra ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append(extra, "-"), strings.NewReader(doc), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestExitCodes(t *testing.T) {
	if code, out, _ := runOn(t, linearizable["concurrent increments"]); code != exitLinearizable || !strings.Contains(out, "result: linearizable") {
		t.Errorf("linearizable history: exit %d, output %q", code, out)
	}
	code, out, _ := runOn(t, notLinearizable["stale read after an acknowledged write"])
	if code != exitNotLinearizable || !strings.Contains(out, "NOT linearizable") || !strings.Contains(out, "key x") {
		t.Errorf("stale read: exit %d, output %q", code, out)
	}
}

func TestBadInputIsRejectedWithAReason(t *testing.T) {
	cases := map[string]string{
		"not json":          `{"operations": [`,
		"unknown op":        history(`{"client":0,"op":"cas","key":"x","call_ns":0,"return_ns":1,"outcome":"ok"}`),
		"unknown outcome":   history(`{"client":0,"op":"get","key":"x","call_ns":0,"return_ns":1,"outcome":"maybe"}`),
		"set without arg":   history(`{"client":0,"op":"set","key":"x","call_ns":0,"return_ns":1,"outcome":"ok"}`),
		"returns too early": history(`{"client":0,"op":"get","key":"x","call_ns":5,"return_ns":1,"outcome":"ok"}`),
		"incr result text":  history(`{"client":0,"op":"incr","key":"x","call_ns":0,"return_ns":1,"outcome":"ok","result":"1"}`),
		"unknown field":     history(`{"client":0,"op":"get","key":"x","call_ns":0,"return_ns":1,"outcome":"ok","extra":1}`),
		"negative client":   history(`{"client":-1,"op":"get","key":"x","call_ns":0,"return_ns":1,"outcome":"ok"}`),
	}
	for name, doc := range cases {
		code, _, stderr := runOn(t, doc)
		if code != exitBadInput || !strings.Contains(stderr, "linearizability:") {
			t.Errorf("%s: exit %d, stderr %q", name, code, stderr)
		}
	}
	if code, _, _ := runOn(t, "", "-no-such-flag"); code != exitBadInput {
		t.Errorf("unknown flag: exit %d", code)
	}
}

func TestVisualisationIsWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.html")
	code, _, stderr := runOn(t, notLinearizable["lost append"], "-html", path)
	if code != exitNotLinearizable {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	html, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(html, []byte("<html")) || !bytes.Contains(html, []byte(`append(a, \"y\")`)) {
		t.Errorf("visualisation does not show the history (%d bytes)", len(html))
	}
}
