package main

// What the CLI prints of the admin API's answers comes in part from tenants: a wake's error carries
// the tail of the tenant's output, notes quote what backings were told. A tenant that writes terminal
// control sequences there (clear the screen, set the title, move the cursor back over a line) must
// not reach the operator's terminal with them. The log escapes them already (its handlers quote);
// the CLI escapes them when it decodes an answer.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// decodeAnswer decodes an admin API answer into v and escapes the control characters of every string
// in it (scrub).
func decodeAnswer(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return err
	}
	scrubValue(reflect.ValueOf(v))
	return nil
}

// scrub escapes the control characters of s that a terminal would act on: every C0 control but
// newline and tab (ESC, CR, BEL, backspace, …), DEL, and the C1 controls (U+0080–U+009F, which some
// terminals take as ESC sequences), as \xNN or \uNNNN.
func scrub(s string) string {
	if strings.IndexFunc(s, unsafeRune) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case !unsafeRune(r):
			b.WriteRune(r)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	return (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f)
}

// scrubValue scrubs every settable string reachable from v: through pointers, interfaces, structs'
// exported fields, slices, arrays and maps (whose string values are replaced).
func scrubValue(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			e := v.Elem()
			if v.Kind() == reflect.Interface && e.Kind() == reflect.String {
				v.Set(reflect.ValueOf(scrub(e.String())))
				return
			}
			scrubValue(e)
		}
	case reflect.String:
		if v.CanSet() {
			v.SetString(scrub(v.String()))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				scrubValue(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			scrubValue(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := v.MapIndex(k)
			c := reflect.New(e.Type()).Elem()
			c.Set(e)
			scrubValue(c)
			v.SetMapIndex(k, c)
		}
	}
}
