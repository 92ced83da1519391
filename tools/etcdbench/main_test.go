package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// A bench without clients: the protocol's parsing and reporting, which need no etcd.
func emptyBench() *bench {
	return &bench{value: "vvvv", hist: newHist(), keySpace: 10}
}

func TestReportOfNothingIsZeroAndParsesAsJSON(t *testing.T) {
	var out bytes.Buffer
	if err := serveBlocks(emptyBench(), strings.NewReader("\nreport\n"), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || lines[0] != `{"ready":true}` {
		t.Fatalf("got %q", out.String())
	}
	var s Summary
	if err := json.Unmarshal([]byte(lines[1]), &s); err != nil {
		t.Fatal(err)
	}
	if s.System != "etcd" || s.Puts != 0 || s.ValueBytes != 4 || s.PutsPerSec != 0 {
		t.Fatalf("got %+v", s)
	}
}

func TestBadCommandsAreRefusedNamingThem(t *testing.T) {
	for input, want := range map[string]string{
		"run x\n":     `"x" is not a count`,
		"run 0\n":     "at least one PUT",
		"go faster\n": `unknown command "go faster"`,
	} {
		err := serveBlocks(emptyBench(), strings.NewReader(input), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", input, err, want)
		}
	}
}

func TestOutOfRangeFlagsAreRefusedBeforeConnecting(t *testing.T) {
	for _, c := range []struct {
		clients, size int
		want          string
	}{{0, 8, "-clients 0"}, {1, 0, "-size 0"}, {1, 1<<20 + 1, "-size"}} {
		err := mainErr([]string{"127.0.0.1:1"}, c.clients, c.size, 1, 0, false, 0, 1)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v", c, err)
		}
	}
}
