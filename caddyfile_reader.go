package browserfailover

import (
	"errors"
	"slices"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// reader reads one browser_failover directive and keeps where each option
// was given, so that an error names the line of the option at fault.
type reader struct {
	d   *caddyfile.Dispenser
	seq int // options read so far: orders marks across blocks
}

// mark is where an option was given: its token and its place in reading
// order.
type mark struct {
	tok caddyfile.Token
	seq int
}

// block is the options of one Caddyfile block (the directive's, a
// provider's, a cooldown's...).
type block struct {
	r          *reader
	start      mark            // the token that opened the block
	at         map[string]mark // option -> where it was last given
	repeatable map[string]bool
}

// open starts a block at the dispenser's current token; the options
// named may be given more than once in it.
func (r *reader) open(repeatable ...string) *block {
	b := &block{r: r, at: map[string]mark{}, repeatable: map[string]bool{}}
	for _, o := range repeatable {
		b.repeatable[o] = true
	}
	b.start = r.here()
	return b
}

func (r *reader) here() mark {
	r.seq++
	return mark{tok: r.d.Token(), seq: r.seq}
}

// option notes the option at the dispenser's current token. A
// single-valued option given before in the same block is an error that
// names both lines.
func (b *block) option() error {
	d := b.r.d
	opt := d.Val()
	if first, ok := b.at[opt]; ok && !b.repeatable[opt] {
		return d.Errf("%s given twice in the same block (first at %s:%d)", opt, first.tok.File, first.tok.Line)
	}
	b.at[opt] = b.r.here()
	return nil
}

// note records opts as given on the block's first line (a provider's name
// and URL, the state's address).
func (b *block) note(opts ...string) {
	for _, o := range opts {
		b.at[o] = b.start
	}
}

// check reports the first problem in err with one of opts, the options
// just read, at their line. Other problems wait: those of options still
// to come, and those judged on the whole block.
func (b *block) check(err error, opts ...string) error {
	for _, e := range config.Problems(err) {
		var p *conf.Problem
		if !errors.As(e, &p) || p.Whole {
			continue
		}
		for _, o := range opts {
			if slices.Contains(p.Options, o) {
				return errAt(b.at[o].tok, e)
			}
		}
	}
	return nil
}

// errUnknownOption is what a block's read answers for an option it does
// not know; each turns it into an error naming the block and the option.
var errUnknownOption = errors.New("unknown option")

// each reads the rest of the block, one option at a time: read sets the
// option named from its arguments (errUnknownOption for a name it does not
// know), given (nil: none) records it as stated, and a problem that
// validate finds with it is reported at its line. At the block's end,
// whatever validate still finds is reported by finish.
func (b *block) each(what string, given *config.Explicit, validate func() error, read func(opt string) error) error {
	d := b.r.d
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := b.option(); err != nil {
			return err
		}
		if err := read(opt); err != nil {
			if errors.Is(err, errUnknownOption) {
				return d.Errf("%s: unknown option %q", what, opt)
			}
			return err
		}
		if given != nil {
			given.Add(opt)
		}
		if err := b.check(validate(), opt); err != nil {
			return err
		}
	}
	return b.finish(validate())
}

// finish reports, at the block's end, the problem in err that comes first
// in the file: each at the line of the last given of its options, or at
// the block's first line when it names none given.
func (b *block) finish(err error) error {
	var first error
	var at mark
	for _, e := range config.Problems(err) {
		m := b.start
		var p *conf.Problem
		if errors.As(e, &p) {
			for _, o := range p.Options {
				if g, ok := b.at[o]; ok && g.seq > m.seq {
					m = g
				}
			}
		}
		if first == nil || m.seq < at.seq {
			first, at = e, m
		}
	}
	if first == nil {
		return nil
	}
	return errAt(at.tok, first)
}

// errAt is err reported at tok's file and line, as Dispenser.Errf does at
// the current token.
func errAt(tok caddyfile.Token, err error) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.WrapErr(err)
}

// oneArg reads exactly one argument of the current option.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", opt)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value", opt)
	}
	return v, nil
}

// someArgs reads the current option's arguments, at least one.
func someArgs(d *caddyfile.Dispenser) ([]string, error) {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.ArgErr()
	}
	return args, nil
}

// listArg reads the arguments of the current option, at least one: what
// it needs tells which.
func listArg(d *caddyfile.Dispenser, what string) ([]string, error) {
	opt := d.Val()
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.Errf("%s needs %s", opt, what)
	}
	return args, nil
}

// noArgs checks that the current option has no argument.
func noArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// intArg reads one integer; its range is for validate to judge.
func intArg(d *caddyfile.Dispenser) (int, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s must be an integer, got %q", opt, v)
	}
	return n, nil
}

// floatArg reads one number; its range is for validate to judge.
func floatArg(d *caddyfile.Dispenser) (float64, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, d.Errf("%s must be a number, got %q", opt, v)
	}
	return f, nil
}

// durationArg reads one Caddy duration; its range is for validate to
// judge.
func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%s: invalid duration %q", opt, v)
	}
	return caddy.Duration(dur), nil
}

// onOff reads on or off; with bareOK the option alone means on.
func onOff(d *caddyfile.Dispenser, bareOK bool) (bool, error) {
	opt := d.Val()
	if !d.NextArg() {
		if bareOK {
			return true, nil
		}
		return false, d.Errf("%s needs on or off", opt)
	}
	v := d.Val()
	if d.NextArg() {
		return false, d.Errf("%s takes one value", opt)
	}
	switch v {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, d.Errf("%s: want on or off, got %q", opt, v)
}

// twoArgs reads exactly two arguments of the current option.
func twoArgs(d *caddyfile.Dispenser) (string, string, error) {
	opt := d.Val()
	args := d.RemainingArgs()
	if len(args) != 2 {
		return "", "", d.Errf("%s takes two values, got %d", opt, len(args))
	}
	return args[0], args[1], nil
}
