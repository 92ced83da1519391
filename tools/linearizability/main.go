// Command linearizability checks a client history of a key-value store for linearizability
// with porcupine, modelling every key as an independent register (see README.md for the
// history format).
//
// Exit status: 0 linearizable, 1 not linearizable (with an explanation per key), 2 bad usage
// or bad input, 3 inconclusive (the -timeout expired first).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

// Exit codes.
const (
	exitLinearizable    = 0
	exitNotLinearizable = 1
	exitBadInput        = 2
	exitInconclusive    = 3
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("linearizability", flag.ContinueOnError)
	flags.SetOutput(stderr)
	timeout := flags.Duration("timeout", 5*time.Minute, "give up (exit 3) after this long; 0 = never")
	htmlPath := flags.String("html", "", "write porcupine's HTML visualisation here (only the failing keys when not linearizable)")
	flags.Usage = func() {
		fmt.Fprintf(stderr, "usage: linearizability [-timeout D] [-html FILE] HISTORY.json|-\n")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return exitBadInput
	}
	if flags.NArg() != 1 {
		flags.Usage()
		return exitBadInput
	}
	input := stdin
	if path := flags.Arg(0); path != "-" {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintf(stderr, "linearizability: %v\n", err)
			return exitBadInput
		}
		defer f.Close()
		input = f
	}
	ops, dropped, err := ReadHistory(input)
	if err != nil {
		fmt.Fprintf(stderr, "linearizability: %v\n", err)
		return exitBadInput
	}
	started := time.Now()
	verdict := Check(ops, *timeout)
	elapsed := time.Since(started).Round(time.Millisecond)
	fmt.Fprintf(stdout, "checked %d operations on %d keys (%d failed or unknown reads dropped) in %s\n",
		verdict.Ops, verdict.Keys, dropped, elapsed)
	if *htmlPath != "" {
		if err := visualise(verdict, ops, *timeout, *htmlPath); err != nil {
			fmt.Fprintf(stderr, "linearizability: visualisation: %v\n", err)
		} else {
			fmt.Fprintf(stdout, "visualisation written to %s\n", *htmlPath)
		}
	}
	switch verdict.Result {
	case porcupine.Ok:
		fmt.Fprintf(stdout, "result: linearizable\n")
		return exitLinearizable
	case porcupine.Illegal:
		fmt.Fprintf(stdout, "result: NOT linearizable (%d of %d keys)\n", len(verdict.Illegal), verdict.Keys)
		for _, v := range verdict.Illegal {
			fmt.Fprint(stdout, v.Explanation)
		}
		return exitNotLinearizable
	default:
		fmt.Fprintf(stdout, "result: inconclusive (no answer within %s)\n", *timeout)
		return exitInconclusive
	}
}

// visualise writes porcupine's HTML view: of the failing keys only when there are some (a full
// history can be too large to browse), of everything otherwise.
func visualise(verdict Verdict, ops []Op, timeout time.Duration, path string) error {
	info := verdict.info
	if len(verdict.Illegal) > 0 {
		failing := map[string]bool{}
		for _, v := range verdict.Illegal {
			failing[v.Key] = true
		}
		var subset []Op
		for _, op := range ops {
			if failing[op.In.Key] {
				subset = append(subset, op)
			}
		}
		info = Check(subset, timeout).info
	}
	return porcupine.VisualizePath(KVModel(), info, path)
}
