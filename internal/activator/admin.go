package activator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
)

// AdminHandler serves the admin API:
//
//	GET  /healthz               200 "ok" while the server runs
//	GET  /routes                every route's Status (JSON); ?state=, ?route= and ?names=true select
//	                            (listQuery)
//	GET  /routes/{name}         one route's Status
//	GET  /routes/{name}/wakes   the route's history: its last wakes and sleeps, oldest first (?last=N)
//	POST /routes/{name}/wake    wake and wait for the result (?wait=false to return at once)
//	POST /routes/{name}/sleep   put to sleep and wait until asleep
//
// Every error is JSON, {"error": "…"}, naming what was asked and what was wrong; a method a path does
// not take gets 405 with Allow, a path no method reaches 404 (adminNoRoute).
//
// metrics, when non-nil, is mounted at /metrics. Every request passes access's checks first (see
// AdminAccess.Guard): the Host, the bearer token when access has one, and for POST a request that no
// browser sends cross-site. A nil access is the zero AdminPolicy: no token, the other checks still.
func (s *Server) AdminHandler(metrics http.Handler, access *AdminAccess) http.Handler {
	r := chi.NewRouter()
	r.Use(access.Guard)
	r.Use(middleware.GetHead) // HEAD is a GET without the body, as for /metrics (it was 405 elsewhere)
	r.NotFound(func(w http.ResponseWriter, req *http.Request) { adminNoRoute(w, req, r) })
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) { adminNoRoute(w, req, r) })
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	if metrics != nil {
		r.Handle("/metrics", metrics)
	}
	r.Get("/routes", func(w http.ResponseWriter, req *http.Request) {
		v, err := adminQuery(req)
		q, code := listQuery{}, http.StatusBadRequest
		if err == nil {
			q, code, err = s.parseListQuery(v)
		}
		if err != nil {
			writeJSON(w, code, map[string]string{"error": "GET /routes: " + err.Error()})
			return
		}
		list := q.filter(s.table.Load().order)
		if q.names {
			writeJSONList(w, list, func(in *instance) string { return in.route.Name })
			return
		}
		writeJSONList(w, list, (*instance).status)
	})
	r.Get("/routes/{name}", func(w http.ResponseWriter, req *http.Request) {
		in := s.instance(chi.URLParam(req, "name"))
		if in == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such route: " + chi.URLParam(req, "name")})
			return
		}
		writeJSON(w, http.StatusOK, in.status())
	})
	r.Get("/routes/{name}/wakes", func(w http.ResponseWriter, req *http.Request) {
		name := chi.URLParam(req, "name")
		in := s.instance(name)
		if in == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such route: " + name})
			return
		}
		q, err := adminQuery(req, "last")
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "GET /routes/" + name + "/wakes: " + err.Error()})
			return
		}
		n := 0
		if v := q.Get("last"); v != "" || q.Has("last") {
			if n, err = strconv.Atoi(v); err != nil || n < 1 || n > HistorySize {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("GET /routes/%s/wakes: last: want a number of events from 1 to %d, got %q", name, HistorySize, v)})
				return
			}
		}
		writeJSON(w, http.StatusOK, in.hist.last(n))
	})
	r.Post("/routes/{name}/wake", func(w http.ResponseWriter, req *http.Request) {
		name := chi.URLParam(req, "name")
		in := s.instance(name) // the route first, as for /wakes: an unknown route is 404 whatever the query
		if in == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such route: " + name})
			return
		}
		q, err := adminQuery(req, "wait")
		if err == nil && q.Has("wait") && q.Get("wait") != "true" && q.Get("wait") != "false" {
			err = fmt.Errorf("wait: want true or false, got %q", q.Get("wait"))
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "POST /routes/" + name + "/wake: " + err.Error()})
			return
		}
		if q.Get("wait") == "false" {
			in.kick()
			writeJSON(w, http.StatusAccepted, in.status())
			return
		}
		s.adminAct(w, req, name, s.Wake)
	})
	r.Post("/routes/{name}/sleep", func(w http.ResponseWriter, req *http.Request) {
		s.adminAct(w, req, chi.URLParam(req, "name"), s.Sleep)
	})
	return r
}

// adminMethods are the methods adminNoRoute tries on a path, in the order Allow lists them.
var adminMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions,
}

// adminNoRoute answers a request that mux routes to no handler, the one place where that becomes an
// answer: 405 with the Allow header when its path takes other methods, else 404, each with a JSON
// error naming the method and the path (and for 405 the methods allowed), as every other admin error
// names what was asked. chi's own 405 had an empty body, an Allow that left out the HEAD which
// middleware.GetHead serves for every GET, and came for a method chi does not know (BREW) on any
// path, one that exists nowhere included; its custom handler is not told the methods allowed, so they
// are found here by asking mux for each.
func adminNoRoute(w http.ResponseWriter, req *http.Request, mux *chi.Mux) {
	path := req.URL.RawPath // as chi routes
	if path == "" {
		path = req.URL.Path
	}
	var allowed []string
	for _, m := range adminMethods {
		if mux.Match(chi.NewRouteContext(), m, path) ||
			m == http.MethodHead && mux.Match(chi.NewRouteContext(), http.MethodGet, path) { // middleware.GetHead
			allowed = append(allowed, m)
		}
	}
	where := req.Method + " " + req.URL.Path
	if len(allowed) == 0 {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": where + ": no such admin path"})
		return
	}
	list := strings.Join(allowed, ", ")
	w.Header().Set("Allow", list)
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": where + ": method not allowed (allowed: " + list + ")"})
}

// adminQuery parses req's query strictly: a pair that does not parse (a bad escape, a semicolon, more
// pairs than net/url allows) is an error, and so is a key outside known, when known is given.
// url.Values from URL.Query drops such pairs silently, so a misspelt filter answered with the whole
// list.
func adminQuery(req *http.Request, known ...string) (url.Values, error) {
	v, err := url.ParseQuery(req.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("malformed query: %w", err)
	}
	if len(known) > 0 {
		for _, key := range slices.Sorted(maps.Keys(v)) {
			if !slices.Contains(known, key) {
				return nil, fmt.Errorf("unknown query key %q (want %s)", key, strings.Join(known, ", "))
			}
		}
	}
	return v, nil
}

// listQuery is what GET /routes was asked for: at 100,000 routes the whole list is 28 MB, and an
// operator looking for the few that are awake, or a shell completing a name, needs far less.
//
//	state=awake,waking  only routes in one of these states (asleep, waking, awake, stopping, failed)
//	route=blog,shop     only these routes and instances (each must exist: 404 otherwise)
//	names=true          the names alone, a JSON array of strings, instead of each Status
//
// A key given more than once adds to its list. Any other key is an error: a misspelt filter must not
// answer with every route.
type listQuery struct {
	states map[State]bool // nil: any state
	routes map[string]bool
	names  bool
}

// parseListQuery reads GET /routes's query, or says what is wrong with it and the status to answer.
func (s *Server) parseListQuery(v url.Values) (listQuery, int, error) {
	var q listQuery
	for _, key := range slices.Sorted(maps.Keys(v)) { // in order: a query with two faults names the same one each time
		vals := v[key]
		switch key {
		case "state":
			q.states = map[State]bool{}
			names := headerTokens(vals)
			if len(names) == 0 {
				return q, http.StatusBadRequest, fmt.Errorf("state: empty; want one or more of %s", strings.Join(StateNames(), ", "))
			}
			for _, name := range names {
				st, ok := parseState(name)
				if !ok {
					return q, http.StatusBadRequest, fmt.Errorf("state: %q is not a state (%s)", name, strings.Join(StateNames(), ", "))
				}
				q.states[st] = true
			}
		case "route":
			q.routes = map[string]bool{}
			names := headerTokens(vals)
			if len(names) == 0 {
				return q, http.StatusBadRequest, errors.New("route: empty; want one or more route names")
			}
			for _, name := range names {
				if s.instance(name) == nil {
					return q, http.StatusNotFound, fmt.Errorf("route: no such route: %q", name)
				}
				q.routes[name] = true
			}
		case "names":
			b, err := strconv.ParseBool(vals[len(vals)-1])
			if err != nil {
				return q, http.StatusBadRequest, fmt.Errorf("names: want true or false, got %q", vals[len(vals)-1])
			}
			q.names = b
		default:
			return q, http.StatusBadRequest, fmt.Errorf("unknown parameter %q (known: state, route, names)", key)
		}
	}
	return q, 0, nil
}

// filter returns the instances of list that q selects, in list's order; list itself when q selects all.
func (q listQuery) filter(list []*instance) []*instance {
	if q.states == nil && q.routes == nil {
		return list
	}
	var out []*instance
	for _, in := range list {
		if q.routes != nil && !q.routes[in.route.Name] {
			continue
		}
		if q.states != nil {
			in.mu.Lock()
			st := in.state
			in.mu.Unlock()
			if !q.states[st] {
				continue
			}
		}
		out = append(out, in)
	}
	return out
}

func (s *Server) adminAct(w http.ResponseWriter, req *http.Request, name string, act func(context.Context, string) error) {
	ctx, cancel := context.WithTimeout(req.Context(), 15*time.Minute)
	defer cancel()
	err := act(ctx, name)
	in := s.instance(name)
	switch {
	case errors.Is(err, errNoRoute) || in == nil:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such route: " + name})
	case err != nil:
		code, _ := statusFor(err)
		writeJSON(w, code, map[string]any{"error": err.Error(), "status": in.status()})
	default:
		writeJSON(w, http.StatusOK, in.status())
	}
}

// writeJSONList answers 200 with the JSON array of each(v) for every v of list, as writeJSON would
// write the slice, but one element at a time through a small buffer. GET /routes is 28 MB at
// 100,000 routes: encoded whole it allocated 254 MB a request, most of it live at once (every
// status, the encoder's buffer, its indented copy), and the activator's RSS grew by hundreds of MB
// over a few requests; one element at a time it allocates 12 MB, a status's worth live at once
// (BenchmarkRoutesList).
func writeJSONList[T, E any](w http.ResponseWriter, list []T, each func(T) E) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if len(list) == 0 {
		_, _ = io.WriteString(w, "[]\n")
		return
	}
	bw := bufio.NewWriterSize(w, 32<<10)
	var elem bytes.Buffer
	enc := json.NewEncoder(&elem)
	enc.SetIndent("  ", "  ") // an element's lines, inside the array's indent
	var e E                   // one for every element: encoding &e boxes no copy of it
	for i, v := range list {
		sep := ",\n  "
		if i == 0 {
			sep = "[\n  "
		}
		elem.Reset()
		e = each(v)
		if err := enc.Encode(&e); err != nil {
			return // not for the types listed here; the client sees a cut-off array
		}
		_, _ = bw.WriteString(sep)
		if _, err := bw.Write(bytes.TrimSuffix(elem.Bytes(), []byte("\n"))); err != nil {
			return // the client went away: encode no more for it
		}
	}
	_, _ = bw.WriteString("\n]\n")
	_ = bw.Flush()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
