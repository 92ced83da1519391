// Command etcdbench times etcd PUTs: CLIENTS concurrent clients, each with its own connection,
// each sending PUTs of SIZE-byte values one at a time, and prints HdrHistogram percentiles and
// throughput as one JSON object.
//
// One-shot: etcdbench -endpoints 127.0.0.1:2379 -clients 8 -size 256 -count 20000
// (or -duration 10s instead of -count). With -leader-only the clients connect to the member
// that leads (asked of the members first) instead of to all of them (where the client library
// spreads requests and followers forward PUTs to the leader).
//
// Blocks (used by `microrep bench etcd` to interleave etcd with microrep in one run): with
// -stdin, it connects, prints {"ready":true}, then reads commands from standard input, one a
// line: "run N" runs N PUTs split across the clients and prints {"block":N,"elapsed_ns":..};
// "report" prints the summary of every PUT since the last report and starts afresh. It exits at
// the end of its input.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Summary is what one measurement prints.
type Summary struct {
	System       string  `json:"system"`
	Clients      int     `json:"clients"`
	ValueBytes   int     `json:"value_bytes"`
	Puts         int64   `json:"puts"`
	Errors       int64   `json:"errors"`
	P50Us        float64 `json:"p50_us"`
	P99Us        float64 `json:"p99_us"`
	P999Us       float64 `json:"p999_us"`
	MaxUs        float64 `json:"max_us"`
	PutsPerSec   float64 `json:"puts_per_s"`
	ElapsedSec   float64 `json:"elapsed_s"`
	FirstErrorIs string  `json:"first_error,omitempty"`
}

// bench holds the clients and what they measured since the last report.
type bench struct {
	clients  []*clientv3.Client
	value    string
	timeout  time.Duration
	hist     *hdrhistogram.Histogram
	errors   int64
	firstErr error
	elapsed  time.Duration
	nextKey  int64
	keySpace int64
}

func newHist() *hdrhistogram.Histogram {
	// 1 ns to 60 s, 3 significant digits.
	return hdrhistogram.New(1, 60_000_000_000, 3)
}

// result of one client's share of a block.
type result struct {
	hist     *hdrhistogram.Histogram
	errors   int64
	firstErr error
}

// run sends n PUTs split across the clients, each client one at a time, and waits for all.
func (b *bench) run(n int64) error {
	if n < 1 {
		return fmt.Errorf("a block needs at least one PUT, got %d", n)
	}
	k := int64(len(b.clients))
	done := make(chan result, k)
	start := time.Now()
	for i, c := range b.clients {
		share := n / k
		if int64(i) < n%k {
			share++
		}
		base := b.nextKey
		b.nextKey += share
		go func(c *clientv3.Client, id int, share, base int64) {
			r := result{hist: newHist()}
			for j := int64(0); j < share; j++ {
				key := "bench/" + strconv.Itoa(id) + "/" + strconv.FormatInt((base+j)%b.keySpace, 10)
				ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
				t0 := time.Now()
				_, err := c.Put(ctx, key, b.value)
				d := time.Since(t0)
				cancel()
				if err != nil {
					r.errors++
					if r.firstErr == nil {
						r.firstErr = err
					}
					continue
				}
				if err := r.hist.RecordValue(max(d.Nanoseconds(), 1)); err != nil && r.firstErr == nil {
					r.firstErr = err
				}
			}
			done <- r
		}(c, i, share, base)
	}
	for range b.clients {
		r := <-done
		b.hist.Merge(r.hist)
		b.errors += r.errors
		if b.firstErr == nil && r.firstErr != nil {
			b.firstErr = r.firstErr
		}
	}
	b.elapsed += time.Since(start)
	return nil
}

// report summarises every PUT since the last report and starts afresh.
func (b *bench) report() Summary {
	us := func(ns int64) float64 { return float64(ns) / 1000.0 }
	h := b.hist
	s := Summary{
		System:     "etcd",
		Clients:    len(b.clients),
		ValueBytes: len(b.value),
		Puts:       h.TotalCount(),
		Errors:     b.errors,
		P50Us:      us(h.ValueAtQuantile(50)),
		P99Us:      us(h.ValueAtQuantile(99)),
		P999Us:     us(h.ValueAtQuantile(99.9)),
		MaxUs:      us(h.Max()),
		ElapsedSec: b.elapsed.Seconds(),
	}
	if b.elapsed > 0 {
		s.PutsPerSec = float64(h.TotalCount()) / b.elapsed.Seconds()
	}
	if b.firstErr != nil {
		s.FirstErrorIs = b.firstErr.Error()
	}
	b.hist, b.errors, b.firstErr, b.elapsed = newHist(), 0, nil, 0
	return s
}

func (b *bench) close() {
	for _, c := range b.clients {
		c.Close()
	}
}

func connect(endpoints []string, clients int, dialTimeout time.Duration) ([]*clientv3.Client, error) {
	var cs []*clientv3.Client
	for i := 0; i < clients; i++ {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dialTimeout})
		if err != nil {
			for _, c := range cs {
				c.Close()
			}
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
		cs = append(cs, c)
	}
	// A first PUT per client: the connection is up and the cluster has a leader.
	for i, c := range cs {
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		_, err := c.Put(ctx, "bench/warmup/"+strconv.Itoa(i), "x")
		cancel()
		if err != nil {
			for _, c := range cs {
				c.Close()
			}
			return nil, fmt.Errorf("first PUT of client %d: %w", i, err)
		}
	}
	return cs, nil
}

func printJSON(w io.Writer, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", line)
	return err
}

// serveBlocks runs the stdin protocol described in the package comment.
func serveBlocks(b *bench, in io.Reader, out io.Writer) error {
	if err := printJSON(out, map[string]bool{"ready": true}); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		words := strings.Fields(lines.Text())
		switch {
		case len(words) == 2 && words[0] == "run":
			n, err := strconv.ParseInt(words[1], 10, 64)
			if err != nil {
				return fmt.Errorf("run: %q is not a count", words[1])
			}
			before := b.elapsed
			if err := b.run(n); err != nil {
				return err
			}
			if err := printJSON(out, map[string]int64{"block": n, "elapsed_ns": (b.elapsed - before).Nanoseconds()}); err != nil {
				return err
			}
		case len(words) == 1 && words[0] == "report":
			if err := printJSON(out, b.report()); err != nil {
				return err
			}
		case len(words) == 0:
		default:
			return fmt.Errorf("unknown command %q (expected \"run N\" or \"report\")", lines.Text())
		}
	}
	return lines.Err()
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated client URLs or host:port of the members")
	clients := flag.Int("clients", 1, "concurrent clients, each with its own connection, one PUT at a time")
	size := flag.Int("size", 64, "value size in bytes")
	count := flag.Int64("count", 10000, "PUTs in total (split across the clients), unless -duration is given")
	duration := flag.Duration("duration", 0, "run for this long instead of -count (blocks of 1,000 PUTs)")
	stdin := flag.Bool("stdin", false, "take blocks from standard input (see the package comment)")
	timeout := flag.Duration("timeout", 5*time.Second, "timeout of one PUT, and of connecting")
	keys := flag.Int64("keys", 1000, "distinct keys per client")
	leaderOnly := flag.Bool("leader-only", false, "connect the clients to the leader only")
	flag.Parse()
	list := strings.Split(*endpoints, ",")
	if *leaderOnly {
		leader, err := findLeader(list, *timeout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcdbench: %v\n", err)
			os.Exit(1)
		}
		list = []string{leader}
	}
	if err := mainErr(list, *clients, *size, *count, *duration, *stdin, *timeout, *keys); err != nil {
		fmt.Fprintf(os.Stderr, "etcdbench: %v\n", err)
		os.Exit(1)
	}
}

// findLeader asks the members which of them leads and returns its endpoint.
func findLeader(endpoints []string, timeout time.Duration) (string, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout})
	if err != nil {
		return "", fmt.Errorf("finding the leader: %w", err)
	}
	defer c.Close()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, ep := range endpoints {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			status, err := c.Status(ctx, ep)
			cancel()
			if err == nil && status.Leader != 0 && status.Header.MemberId == status.Leader {
				return ep, nil
			}
		}
	}
	return "", fmt.Errorf("no member of %v reported itself the leader within %v", endpoints, timeout)
}

func mainErr(endpoints []string, clients, size int, count int64, duration time.Duration, stdin bool,
	timeout time.Duration, keys int64) error {
	switch {
	case clients < 1 || clients > 1024:
		return fmt.Errorf("-clients %d: expected 1 to 1024", clients)
	case size < 1 || size > 1<<20:
		return fmt.Errorf("-size %d: expected 1 to 1048576 bytes", size)
	case keys < 1:
		return fmt.Errorf("-keys %d: expected at least 1", keys)
	case duration < 0 || duration > time.Hour:
		return fmt.Errorf("-duration %v: expected at most 1h", duration)
	case !stdin && duration == 0 && count < 1:
		return fmt.Errorf("-count %d: expected at least 1", count)
	}
	cs, err := connect(endpoints, clients, timeout)
	if err != nil {
		return err
	}
	b := &bench{clients: cs, value: strings.Repeat("v", size), timeout: timeout, hist: newHist(), keySpace: keys}
	defer b.close()
	if stdin {
		return serveBlocks(b, os.Stdin, os.Stdout)
	}
	if duration > 0 {
		for deadline := time.Now().Add(duration); time.Now().Before(deadline); {
			if err := b.run(1000); err != nil {
				return err
			}
		}
	} else if err := b.run(count); err != nil {
		return err
	}
	s := b.report()
	if err := printJSON(os.Stdout, s); err != nil {
		return err
	}
	if s.Errors > 0 {
		return errors.New("some PUTs failed: " + s.FirstErrorIs)
	}
	return nil
}
