package upstreams

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxAnswerHeader bounds the status line and headers of a provider's answer.
const MaxAnswerHeader = 64 << 10

// maxAnswerFields bounds the number of header lines of an answer.
const maxAnswerFields = 200

// errMalformed marks an answer that is not HTTP/1.x.
var errMalformed = errors.New("malformed HTTP answer")

// Answer is a provider's HTTP answer to the upgrade (or discovery) request.
type Answer struct {
	Status int
	Header http.Header
	// Raw holds the status line and header block as received, ending with
	// the blank line.
	Raw []byte
}

// ReadAnswer reads one HTTP/1.x status line and header block from br, at
// most limit bytes in all. It does not read a body.
func ReadAnswer(br *bufio.Reader, limit int) (*Answer, error) {
	// Sized for a usual 101, so that reading it rarely grows the buffer.
	raw := make([]byte, 0, min(limit, 256))
	line, err := readLine(br, &raw, limit)
	if err != nil {
		return nil, err
	}
	// "HTTP/1.1 101 Switching Protocols"
	proto, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok || !bytes.HasPrefix(proto, []byte("HTTP/1.")) || len(proto) != 8 {
		return nil, fmt.Errorf("%w: bad status line", errMalformed)
	}
	codeText, _, _ := bytes.Cut(rest, []byte{' '})
	code := 0
	for _, c := range codeText {
		if c < '0' || c > '9' {
			code = -1
			break
		}
		code = code*10 + int(c-'0')
	}
	if len(codeText) != 3 || code < 100 || code > 999 {
		return nil, fmt.Errorf("%w: bad status code", errMalformed)
	}
	// The field lines are read first, then parsed out of one string: the
	// names and values are substrings of it, the values share one slice.
	var ends []int
	for {
		line, err := readLine(br, &raw, limit)
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			break
		}
		if len(ends) >= maxAnswerFields {
			return nil, fmt.Errorf("%w: too many header fields", errMalformed)
		}
		ends = append(ends, len(raw))
	}
	a := &Answer{Status: code, Header: make(http.Header, len(ends)), Raw: raw}
	head := string(raw)
	values := make([]string, len(ends))
	start := strings.IndexByte(head, '\n') + 1
	for i, end := range ends {
		line := strings.TrimSuffix(strings.TrimSuffix(head[start:end], "\n"), "\r")
		start = end
		if line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("%w: obsolete line folding", errMalformed)
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || len(k) == 0 || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("%w: bad header line", errMalformed)
		}
		key := textproto.CanonicalMIMEHeaderKey(k)
		values[i] = strings.TrimSpace(v)
		if prev, ok := a.Header[key]; ok {
			a.Header[key] = append(prev, values[i])
		} else {
			a.Header[key] = values[i : i+1 : i+1]
		}
	}
	return a, nil
}

// readLine reads one CRLF (or LF) terminated line, appending it whole to raw
// and returning it without the line end. It fails once raw exceeds limit.
func readLine(br *bufio.Reader, raw *[]byte, limit int) ([]byte, error) {
	start := len(*raw)
	for {
		chunk, err := br.ReadSlice('\n')
		if len(*raw)+len(chunk) > limit {
			return nil, fmt.Errorf("%w: header larger than %d bytes", errMalformed, limit)
		}
		*raw = append(*raw, chunk...)
		if err == nil {
			break
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return nil, err
	}
	line := (*raw)[start:]
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	return line, nil
}

// ParseRetryAfter reads a Retry-After value: delta seconds or an HTTP date.
// It returns 0 when v is empty, malformed or in the past.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(365*24*time.Hour/time.Second) {
			secs = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// HeaderField is one header line the gateway adds to an answer.
type HeaderField struct{ Name, Value string }

// RawWithHeaders returns Raw with each of fields set: any line of those
// fields the provider sent is dropped (a provider may itself be a gateway
// that names its sessions the same way), and the fields are added, in
// order, as the last header lines, with the answer's own line ending. Raw
// itself is not changed.
func (a *Answer) RawWithHeaders(fields ...HeaderField) []byte {
	raw := a.Raw
	eol := []byte("\r\n")
	if !bytes.HasSuffix(raw, eol) {
		eol = []byte("\n")
	}
	body := bytes.TrimSuffix(raw, eol) // without the blank line's end
	size := len(raw)
	for _, f := range fields {
		size += len(f.Name) + len(f.Value) + 4
	}
	out := make([]byte, 0, size)
	for i := 0; len(body) > 0; i++ {
		line, rest, _ := bytes.Cut(body, []byte{'\n'})
		body = rest
		k, _, ok := bytes.Cut(line, []byte{':'})
		if i > 0 && ok && slices.ContainsFunc(fields, func(f HeaderField) bool { return strings.EqualFold(string(k), f.Name) }) {
			continue
		}
		out = append(out, line...)
		out = append(out, '\n')
	}
	for _, f := range fields {
		out = append(out, f.Name...)
		out = append(out, ": "...)
		out = append(out, f.Value...)
		out = append(out, eol...)
	}
	return append(out, eol...)
}
