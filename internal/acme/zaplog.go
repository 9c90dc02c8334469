package acme

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap/zapcore"
)

// slogCore is a zapcore.Core that writes to an slog.Handler: certmagic logs through zap, the edge
// through slog. certmagic's Info (locks taken, challenges served) becomes Debug, and its Error Warn:
// the Manager logs each certificate obtained and each failure at Info and Error itself, and one
// failed order was five ERROR lines of certmagic's besides (found by an operator trial).
type slogCore struct{ h slog.Handler }

var _ zapcore.Core = slogCore{}

func (c slogCore) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), slogLevel(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{h: c.h.WithAttrs(attrs(fields))}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	if name := strings.TrimLeft(e.LoggerName, "."); name != "" { // certmagic names some ".acme_client"
		r.AddAttrs(slog.String("logger", name))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l < zapcore.WarnLevel:
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// attrs are fields as slog attributes, in key order.
func attrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		out = append(out, slog.Any(k, enc.Fields[k]))
	}
	return out
}
