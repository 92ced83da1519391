package main

import "testing"

func TestStepFollowsRedisSemantics(t *testing.T) {
	absent := Register{}
	one := Register{Present: true, Value: "1"}
	word := Register{Present: true, Value: "ab"}
	cases := []struct {
		name  string
		state Register
		in    Input
		out   Output
		ok    bool
		next  Register
	}{
		{"get absent", absent, Input{Kind: KindGet}, Output{}, true, absent},
		{"get absent sees a value", absent, Input{Kind: KindGet}, Output{Present: true, Value: ""}, false, absent},
		{"get present", one, Input{Kind: KindGet}, Output{Present: true, Value: "1"}, true, one},
		{"get wrong value", one, Input{Kind: KindGet}, Output{Present: true, Value: "2"}, false, one},
		{"set", absent, Input{Kind: KindSet, Arg: "ab"}, Output{}, true, word},
		{"incr absent", absent, Input{Kind: KindIncr}, Output{Int: 1}, true, one},
		{"incr wrong reply", absent, Input{Kind: KindIncr}, Output{Int: 2}, false, one},
		{"incr non-integer acknowledged", word, Input{Kind: KindIncr}, Output{Int: 1}, false, word},
		{"incr non-integer unknown", word, Input{Kind: KindIncr}, Output{Unknown: true}, true, word},
		{"append to absent", absent, Input{Kind: KindAppend, Arg: "ab"}, Output{Int: 2}, true, word},
		{"append wrong length", one, Input{Kind: KindAppend, Arg: "x"}, Output{Int: 1}, false, Register{Present: true, Value: "1x"}},
		{"del present", one, Input{Kind: KindDel}, Output{Int: 1}, true, absent},
		{"del absent", absent, Input{Kind: KindDel}, Output{Int: 0}, true, absent},
		{"del wrong count", absent, Input{Kind: KindDel}, Output{Int: 1}, false, absent},
		{"unknown set", absent, Input{Kind: KindSet, Arg: "1"}, Output{Unknown: true}, true, one},
	}
	for _, c := range cases {
		ok, next := Step(c.state, c.in, c.out)
		if ok != c.ok || (ok && next != c.next) {
			t.Errorf("%s: got (%v, %v), want (%v, %v)", c.name, ok, next, c.ok, c.next)
		}
	}
}

func TestDescribe(t *testing.T) {
	cases := map[string]struct {
		in  Input
		out Output
	}{
		`get(k) -> nil`:                         {Input{Kind: KindGet, Key: "k"}, Output{}},
		`get(k) -> "v"`:                         {Input{Kind: KindGet, Key: "k"}, Output{Present: true, Value: "v"}},
		`set(k, "v") -> OK`:                     {Input{Kind: KindSet, Key: "k", Arg: "v"}, Output{}},
		`incr(k) -> 3`:                          {Input{Kind: KindIncr, Key: "k"}, Output{Int: 3}},
		`append(k, "v") -> ? (outcome unknown)`: {Input{Kind: KindAppend, Key: "k", Arg: "v"}, Output{Unknown: true}},
	}
	for want, c := range cases {
		if got := Describe(c.in, c.out); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
