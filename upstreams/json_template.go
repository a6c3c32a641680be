package upstreams

// JSON templates and pointers: a session API's bodies and a webdriver
// provider's capabilities filled with placeholders, and the values a
// create or list answer holds at a JSON pointer (RFC 6901), read whole or
// from an answer cut short.

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// fill replaces placeholders in every string of a parsed JSON template and
// renders it; values are JSON-escaped by the encoder.
func fill(t any, replace func(string) string) []byte {
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			return fillString(x, replace)
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = walk(e)
			}
			return out
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[replace(k)] = walk(e)
			}
			return out
		}
		return v
	}
	b, _ := json.Marshal(walk(t))
	return b
}

// pointer resolves a JSON pointer in doc to a string (a number is given as
// its decimal text).
func pointer(doc any, p string) (string, bool) {
	cur, ok := pointerValue(doc, p)
	if !ok {
		return "", false
	}
	switch x := cur.(type) {
	case string:
		return x, x != ""
	case json.Number:
		return x.String(), true
	}
	return "", false
}

// pointerValue is the value at the JSON pointer p in doc.
func pointerValue(doc any, p string) (any, bool) {
	cur := doc
	for _, tok := range strings.Split(p, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := cur.(type) {
		case map[string]any:
			v, ok := x[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			cur = x[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// findPointer finds the string (or number) at the JSON pointer p in raw,
// reading JSON tokens in order, so that it also finds it in a document cut
// short after it, or malformed after it. The first value at p counts.
func findPointer(raw []byte, p string) (string, bool) {
	want := strings.Split(p, "/")[1:]
	for i, tok := range want {
		want[i] = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
	}
	// One frame per open object or array: the key or index of the value
	// read in it now.
	type frame struct {
		obj     bool
		wantKey bool
		key     string
		idx     int
	}
	var stack []frame
	here := func() bool {
		if len(stack) != len(want) {
			return false
		}
		for i, f := range stack {
			if f.obj {
				if f.key != want[i] {
					return false
				}
			} else if n, err := strconv.Atoi(want[i]); err != nil || n != f.idx {
				return false
			}
		}
		return true
	}
	// next moves the innermost frame past the value just read.
	next := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].obj {
				stack[n-1].wantKey = true
			} else {
				stack[n-1].idx++
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			if k, isKey := tok.(string); isKey {
				stack[n-1].key, stack[n-1].wantKey = k, false
				continue
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if here() {
					return "", false // p names an object or an array
				}
				stack = append(stack, frame{obj: v == '{', wantKey: v == '{'})
				continue
			default: // '}' or ']'
				stack = stack[:len(stack)-1]
			}
		case string:
			if here() {
				return v, v != ""
			}
		case json.Number:
			if here() {
				return v.String(), true
			}
		default:
			if here() {
				return "", false
			}
		}
		if len(stack) == 0 {
			return "", false // the whole document was read
		}
		next()
	}
}

// FillJSON replaces placeholders in every string of the JSON template t
// (values are JSON-escaped); "" stays "".
func FillJSON(t string, replace func(string) string) (string, error) {
	if t == "" {
		return "", nil
	}
	var v any
	if err := json.Unmarshal([]byte(t), &v); err != nil {
		return "", errors.New("not valid JSON")
	}
	return string(fill(v, replace)), nil
}
