package activator

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
)

// Real User-Agent strings, copied as the clients send them.
var (
	// browserAgents must never match the monitors preset: they are people.
	browserAgents = []string{
		// Chrome on Windows, macOS, Linux, Android; Edge; Opera; Yandex Browser; Samsung Internet.
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Safari/537.36 OPR/115.0.0.0",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 YaBrowser/24.6.0.0 Safari/537.36",
		"Mozilla/5.0 (Linux; Android 14; SAMSUNG SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/26.0 Chrome/122.0.0.0 Mobile Safari/537.36",
		// Firefox on Windows, Ubuntu, Android.
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
		"Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
		"Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0",
		// Safari on macOS, iPhone, iPad; Chrome on iOS.
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (iPad; CPU OS 17_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.6 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1",
		// In-app browsers: a person reading a link in Facebook, Instagram, LinkedIn, Slack, Discord.
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 [FBAN/FBIOS;FBAV/468.0.0.40.107;FBBV/631617893;FBDV/iPhone15,3;FBMD/iPhone;FBSN/iOS;FBSV/17.5;FBSS/3;FBCR/;FBID/phone;FBLC/en_US;FBOP/80]",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Instagram 339.0.3.12.91 (iPhone15,3; iOS 17_5; en_US; en; scale=3.00; 1290x2796; 621709221)",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 [LinkedInApp]/9.29.6960",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Slack/4.41.105 Chrome/130.0.6723.137 Electron/33.2.0 Safari/537.36 Sonic Slack_SSB/4.41.105",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) discord/1.0.9173 Chrome/128.0.6613.186 Electron/32.2.7 Safari/537.36",
		// Tools a person runs by hand.
		"curl/8.5.0",
		"Wget/1.21.4",
	}
	// monitorAgents must match the monitors preset: uptime monitors, crawlers, link previews.
	monitorAgentStrings = []string{
		"Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)",
		"Pingdom.com_bot_version_1.4_(http://www.pingdom.com/)",
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/61.0.3163.100 Safari/537.36 PingdomPageSpeed/1.0 (pingbot/2.0; +http://www.pingdom.com/)",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/55.0.2883.87 Safari/537.36 StatusCake",
		"Better Uptime Bot Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/89.0.4389.82 Safari/537.36",
		"Better Stack Better Uptime Bot Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/89.0.4389.82 Safari/537.36",
		"Mozilla/5.0 (Windows NT 6.1; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/60.0.3112.113 Safari/537.36 Site24x7",
		"Freshping-Bot/1.0 (+https://www.freshworks.com/website-monitoring/)",
		"Uptime-Kuma/1.23.13",
		"Datadog/Synthetics",
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/101.0.4951.41 Safari/537.36 NewRelicSynthetics/1.0",
		"NewRelicPinger/1.0 (269834)",
		"Checkly/1.0 (https://www.checklyhq.com)",
		"Mozilla/5.0 (compatible; HetrixTools Uptime Monitoring Bot. https://hetrix.tools/)",
		"Amazon-Route53-Health-Check-Service (ref 1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d; report http://amzn.to/1vsZADi)",
		"ELB-HealthChecker/2.0",
		"GoogleHC/1.0",
		"kube-probe/1.31",
		"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
		"Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.6778.69 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
		"Googlebot-Image/1.0",
		"AdsBot-Google (+http://www.google.com/adsbot.html)",
		"Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
		"DuckDuckBot/1.1; (+http://duckduckgo.com/duckduckbot.html)",
		"Mozilla/5.0 (compatible; Baiduspider/2.0; +http://www.baidu.com/search/spider.html)",
		"Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/13.1.1 Safari/605.1.15 (Applebot/0.1; +http://www.apple.com/go/applebot)",
		"Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
		"Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)",
		"Mozilla/5.0 (compatible; MJ12bot/v1.4.8; http://mj12bot.com/)",
		"Mozilla/5.0 (Linux; Android 7.0;) AppleWebKit/537.36 (KHTML, like Gecko) Mobile Safari/537.36 (compatible; PetalBot;+https://webmaster.petalsearch.com/site/petalbot)",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_10_1) AppleWebKit/600.2.5 (KHTML, like Gecko) Version/8.0.2 Safari/600.2.5 (Amazonbot/0.1; +https://developer.amazon.com/support/amazonbot)",
		"Mozilla/5.0 (Linux; Android 5.0) AppleWebKit/537.36 (KHTML, like Gecko) Mobile Safari/537.36 (compatible; Bytespider; spider-feedback@bytedance.com)",
		"Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.1; +https://openai.com/gptbot)",
		"Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0; +claudebot@anthropic.com)",
		"CCBot/2.0 (https://commoncrawl.org/faq/)",
		"facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_11_1) AppleWebKit/601.2.4 (KHTML, like Gecko) Version/9.0.1 Safari/601.2.4 facebookexternalhit/1.1 Facebot Twitterbot/1.0",
		"Twitterbot/1.0",
		"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
		"Slackbot 1.0 (+https://api.slack.com/robots)",
		"Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
		"LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
		"TelegramBot (like TwitterBot)",
		"WhatsApp/2.23.20.0 A",
	}
)

func TestMonitorsPreset(t *testing.T) {
	f := newFilter(&registry.Ignore{Preset: "monitors", Status: http.StatusServiceUnavailable}, nil)
	for _, ua := range browserAgents {
		if f.ignores(requestAs(http.MethodGet, "/", ua)) {
			t.Errorf("monitors preset matches a browser: %q", ua)
		}
	}
	for _, ua := range monitorAgentStrings {
		if !f.ignores(requestAs(http.MethodGet, "/", ua)) {
			t.Errorf("monitors preset misses %q", ua)
		}
	}
	if f.ignores(requestAs(http.MethodGet, "/", "")) {
		t.Error("monitors preset matches a request without a User-Agent")
	}
}

// TestMonitorsPresetDocumented: docs/filters.md lists every pattern of the preset, and no other.
func TestMonitorsPresetDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/filters.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, list, ok := strings.Cut(doc, "<!-- monitors preset -->")
	list, _, ok2 := strings.Cut(list, "<!-- end of the monitors preset -->")
	if !ok || !ok2 {
		t.Fatal("docs/filters.md: no <!-- monitors preset --> … <!-- end of the monitors preset --> block")
	}
	var documented []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(list, -1) {
		documented = append(documented, m[1])
	}
	if got, want := strings.Join(documented, "\n"), strings.Join(monitorAgents[:], "\n"); got != want {
		t.Errorf("docs/filters.md lists the preset as\n%s\nwant (filter.go's monitorAgents, in order)\n%s", got, want)
	}
}

func TestFilterMatches(t *testing.T) {
	const chrome = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
	ig := &registry.Ignore{
		Methods: []string{"HEAD", "OPTIONS"},
		Paths:   []string{"/healthz", "/status/*.json", "/static/**", "/api/*/ping/**"},
		UserAgents: []*regexp.Regexp{
			regexp.MustCompile("(?i)my-checker/[0-9]+"),    // a regexp
			regexp.MustCompile("(?i)Acme-Probe|ZetaWatch"), // words: compared without the regexp engine
		},
		Status: http.StatusServiceUnavailable,
	}
	f := newFilter(ig, nil)
	if len(f.agents) != 1 || strings.Join(f.words, ",") != "acme-probe,zetawatch" {
		t.Errorf("user_agents split into regexps %v and words %q, want 1 regexp and acme-probe,zetawatch", f.agents, f.words)
	}
	for _, tc := range []struct {
		method, path, ua string
		want             bool
	}{
		{"GET", "/", chrome, false},
		{"HEAD", "/", chrome, true},
		{"OPTIONS", "/x", chrome, true},
		{"POST", "/", chrome, false},
		{"GET", "/healthz", chrome, true},
		{"GET", "/healthz/", chrome, false},
		{"GET", "/healthzz", chrome, false},
		{"GET", "/status/a.json", chrome, true},
		{"GET", "/status/a/b.json", chrome, false}, // * does not cross a slash
		{"GET", "/static", chrome, true},           // /** matches the directory itself
		{"GET", "/static/", chrome, true},
		{"GET", "/static/css/site.css", chrome, true},
		{"GET", "/staticx/site.css", chrome, false},
		{"GET", "/api/v1/ping", chrome, true},
		{"GET", "/api/v1/ping/deep/er", chrome, true},
		{"GET", "/api/v1/pong/x", chrome, false},
		{"GET", "/api", chrome, false},
		{"GET", "/", "My-Checker/12 (+https://example.com)", true}, // case-insensitive, anywhere
		{"GET", "/", "My-Checker/x", false},
		{"GET", "/", "Mozilla/5.0 (compatible; ACME-PROBE 2.0)", true},
		{"GET", "/", "zetawatch", true},
		{"GET", "/", "zetawatc", false},
		{"GET", "/", "Mozilla/5.0 (compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)", false}, // no preset
	} {
		if got := f.ignores(requestAs(tc.method, tc.path, tc.ua)); got != tc.want {
			t.Errorf("%s %s %q: ignored %v, want %v", tc.method, tc.path, tc.ua, got, tc.want)
		}
	}
	// Every User-Agent field counts: a bot's behind a browser's first one is still the bot's.
	two := requestAs("GET", "/", chrome)
	two.Header.Add("User-Agent", "ZetaWatch/1.0")
	if !f.ignores(two) {
		t.Error("a request with a browser's User-Agent, then a matching one, was not ignored")
	}
	if all := newFilter(&registry.Ignore{Paths: []string{"/**"}, Status: 503}, nil); !all.ignores(requestAs("GET", "/a/b", chrome)) {
		t.Error("/** does not match /a/b")
	}
	if newFilter(&registry.Ignore{Status: 503}, nil) != nil {
		t.Error("a route without ignore: has a filter; it must cost nothing")
	}
}

func requestAs(method, path, ua string) *http.Request {
	r := httptest.NewRequest(method, "http://app.test"+path, nil)
	if ua != "" {
		r.Header.Set("User-Agent", ua)
	}
	return r
}

const uptimeRobot = "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)"

func withMonitorsIgnored(r *registry.Route) {
	r.Ignore = registry.Ignore{Preset: "monitors", Status: http.StatusServiceUnavailable}
}

// TestIgnoredRequestsNeitherWakeNorKeepAwake is the state machine's rule: an ignored request to a
// sleeping (or waking) tenant is refused without a wake; one to an awake tenant is served, but the idle
// clock runs on from the last counted request; and a sleep due while ignored requests are in flight
// waits for them, refusing the ignored requests that come meanwhile.
func TestIgnoredRequestsNeitherWakeNorKeepAwake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		_, in := newTestServer(t, b, passGate{}, withMonitorsIgnored) // idle: 1m
		// The longest an ignored request in flight puts a due sleep off.
		in.setGrace(10 * time.Minute)
		monitor := requestAs(http.MethodGet, "/", uptimeRobot)
		browser := requestAs(http.MethodGet, "/", browserAgents[0])

		// Asleep: refused, nothing woken, nothing held.
		_, err := in.acquireRequest(monitor, nil)
		var ie *IgnoredError
		if !errors.As(err, &ie) {
			t.Fatalf("ignored request to a sleeping route: %v, want an IgnoredError", err)
		}
		if code, retry := statusFor(err); code != http.StatusServiceUnavailable || retry != ignoredRetryAfter {
			t.Errorf("ignored request answered %d with Retry-After %v, want 503 with %v", code, retry, ignoredRetryAfter)
		}
		if st := in.status(); b.wakes.Load() != 0 || st.State != "asleep" || st.Held != 0 {
			t.Fatalf("after an ignored request: %d wakes, state %s, %d held; want none, asleep, 0", b.wakes.Load(), st.State, st.Held)
		}

		// Waking: an ignored request does not join the hold.
		b.set(func(f *fakeBackend) { f.wakeGate = make(chan struct{}) })
		woken := make(chan error, 1)
		go func() {
			rel, err := in.acquireRequest(browser, nil)
			if err == nil {
				rel()
			}
			woken <- err
		}()
		synctest.Wait()
		if _, err := in.acquireRequest(monitor, nil); !errors.As(err, &ie) {
			t.Errorf("ignored request to a waking route: %v, want an IgnoredError", err)
		}
		if st := in.status(); st.State != "waking" || st.Held != 1 {
			t.Errorf("waking route: state %s, %d held; want waking, 1 (the browser's)", st.State, st.Held)
		}
		b.set(func(f *fakeBackend) { close(f.wakeGate); f.wakeGate = nil })
		if err := <-woken; err != nil {
			t.Fatalf("browser request: %v", err)
		}
		awakeAt := time.Now() // the browser's request ended: the idle clock runs from here

		// Awake: ignored requests are served, and do not restart the idle clock.
		for range 5 {
			time.Sleep(10 * time.Second)
			rel, err := in.acquireRequest(monitor, nil)
			if err != nil {
				t.Fatalf("ignored request to an awake route: %v", err)
			}
			rel()
		}
		synctest.Wait()
		if st := in.status(); st.State != "awake" {
			t.Fatalf("state %s after ignored requests, want awake", st.State)
		}
		time.Sleep(time.Until(awakeAt.Add(time.Minute + time.Second))) // a second past: had a monitor restarted the clock, it would be 50s off
		synctest.Wait()
		if st := in.status(); st.State != "asleep" || b.sleeps.Load() != 1 {
			t.Fatalf("one idle window after the browser's request: state %s, %d sleeps; want asleep, 1", st.State, b.sleeps.Load())
		}

		// A sleep due while an ignored request is in flight waits for it.
		rel, err := in.acquireRequest(browser, nil)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		slow, err := in.acquireRequest(monitor, nil)
		if err != nil {
			t.Fatalf("ignored request to an awake route: %v", err)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if st := in.status(); st.State != "awake" || st.InFlight != 1 {
			t.Fatalf("idle window over with an ignored request in flight: state %s, in flight %d; want awake (the sleep waits), 1", st.State, st.InFlight)
		}
		if _, err := in.acquireRequest(monitor, nil); !errors.As(err, &ie) {
			t.Errorf("ignored request while the sleep is due: %v, want an IgnoredError", err)
		}
		slow()
		synctest.Wait()
		if st := in.status(); st.State != "asleep" || b.sleeps.Load() != 2 {
			t.Fatalf("after the last ignored request: state %s, %d sleeps; want asleep, 2", st.State, b.sleeps.Load())
		}

		// A counted request while the sleep is due keeps the tenant awake as always.
		rel, err = in.acquireRequest(browser, nil)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		slow, err = in.acquireRequest(monitor, nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Minute) // the sleep is due, and waits for the monitor
		rel, err = in.acquireRequest(browser, nil)
		if err != nil {
			t.Fatalf("browser request while a sleep is due: %v", err)
		}
		slow()
		synctest.Wait()
		if st := in.status(); st.State != "awake" {
			t.Fatalf("state %s with a browser request in flight, want awake", st.State)
		}
		rel()
		time.Sleep(time.Minute)
		synctest.Wait()
		if st := in.status(); st.State != "asleep" || b.sleeps.Load() != 3 {
			t.Fatalf("idle window after the browser's request: state %s, %d sleeps; want asleep, 3", st.State, b.sleeps.Load())
		}

		// An ignored request that never ends (a monitor's event stream) puts the sleep off for the
		// grace, no longer: the sleep then goes ahead under it.
		in.setGrace(30 * time.Second)
		rel, err = in.acquireRequest(browser, nil)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		stuck, err := in.acquireRequest(monitor, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer stuck()
		time.Sleep(time.Minute + 29*time.Second)
		synctest.Wait()
		if st := in.status(); st.State != "awake" {
			t.Fatalf("within the grace after the idle window: state %s, want awake", st.State)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if st := in.status(); st.State != "asleep" || b.sleeps.Load() != 4 {
			t.Fatalf("past the grace with an ignored request still in flight: state %s, %d sleeps; want asleep, 4", st.State, b.sleeps.Load())
		}

		st := in.status()
		if st.Filtered == nil || st.Filtered.Refused != 3 || st.Filtered.Served != 8 {
			t.Errorf("status filtered %+v, want 3 refused, 8 served", st.Filtered)
		}
		if b.wakes.Load() != 4 {
			t.Errorf("%d wakes, want 4 (each by a browser request)", b.wakes.Load())
		}
	})
}

// TestIgnoredRequestAtTheEdge: through ServeHTTP, a monitor gets 503 with Retry-After from a sleeping
// route, and the counters (status and metrics) see it.
func TestIgnoredRequestAtTheEdge(t *testing.T) {
	b := &fakeBackend{}
	reg := prometheus.NewRegistry()
	r := testRoute("app")
	r.Ignore = registry.Ignore{Preset: "monitors", Status: http.StatusServiceUnavailable}
	quiet := testRoute("quiet")
	s := New(Options{Opener: fakeProvider{b}, NewGate: func(*registry.Route) Gate { return passGate{} }, Metrics: NewMetrics(reg)})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r, quiet}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })

	// From the start, at 0, for the route with ignore: and for no other.
	if got := filteredSeries(t, reg); len(got) != 2 || got["app/refused"] != 0 || got["app/served"] != 0 {
		t.Errorf("activator_filtered_requests_total at the start: %v, want app's two series at 0", got)
	}

	w := httptest.NewRecorder()
	req := requestAs(http.MethodGet, "/", uptimeRobot)
	req.Host = "app.test"
	s.ServeHTTP(w, req)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "60" {
		t.Errorf("monitor to a sleeping route: %d, Retry-After %q; want 503, 60", w.Code, w.Header().Get("Retry-After"))
	}
	if body := w.Body.String(); !strings.Contains(body, `route "app"`) || !strings.Contains(body, "ignore") {
		t.Errorf("body %q, want it to name the route and say why", body)
	}
	if b.wakes.Load() != 0 {
		t.Errorf("%d wakes, want 0", b.wakes.Load())
	}
	if got := filteredSeries(t, reg); got["app/refused"] != 1 || got["app/served"] != 0 {
		t.Errorf("activator_filtered_requests_total = %v, want app refused 1, served 0", got)
	}
	if st := s.instance("app").status(); st.Filtered == nil || st.Filtered.Refused != 1 {
		t.Errorf("status filtered %+v, want 1 refused", st.Filtered)
	}
	if st := s.instance("quiet").status(); st.Filtered != nil {
		t.Errorf("route without ignore: status filtered %+v, want none", st.Filtered)
	}

	// A configured status: no Retry-After.
	r2 := testRoute("app")
	r2.Ignore = registry.Ignore{Methods: []string{"HEAD"}, Status: http.StatusNoContent}
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r2}}); err != nil {
		t.Fatal(err)
	}
	w = httptest.NewRecorder()
	req = requestAs(http.MethodHead, "/", "")
	req.Host = "app.test"
	s.ServeHTTP(w, req)
	if w.Code != http.StatusNoContent || w.Header().Get("Retry-After") != "" {
		t.Errorf("HEAD with status 204: %d, Retry-After %q; want 204 without", w.Code, w.Header().Get("Retry-After"))
	}
}

// filteredSeries reads activator_filtered_requests_total as "route/action" → value.
func filteredSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "activator_filtered_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var route, action string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "route":
					route = l.GetValue()
				case "action":
					action = l.GetValue()
				}
			}
			out[route+"/"+action] = m.GetCounter().GetValue()
		}
	}
	return out
}

var benchIgnored bool

// BenchmarkFilter is the check a request to a route with ignore: pays: the monitors preset and one
// user pattern against a browser's User-Agent (no match: the common case) and a monitor's.
func BenchmarkFilter(b *testing.B) {
	f := newFilter(&registry.Ignore{
		Methods:    []string{"HEAD"},
		Paths:      []string{"/healthz", "/static/**"},
		UserAgents: []*regexp.Regexp{regexp.MustCompile("(?i)my-checker/")},
		Preset:     "monitors", Status: http.StatusServiceUnavailable,
	}, nil)
	for _, bc := range []struct{ name, ua string }{
		{"chrome", browserAgents[0]},
		{"iphone", browserAgents[12]},
		{"uptimerobot", uptimeRobot},
		{"googlebot-smartphone", monitorAgentStrings[19]},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := requestAs(http.MethodGet, "/app/page", bc.ua)
			b.ReportAllocs()
			for b.Loop() {
				benchIgnored = f.ignores(r)
			}
		})
	}
	b.Run("preset-only/chrome", func(b *testing.B) {
		f := newFilter(&registry.Ignore{Preset: "monitors", Status: 503}, nil)
		r := requestAs(http.MethodGet, "/app/page", browserAgents[0])
		b.ReportAllocs()
		for b.Loop() {
			benchIgnored = f.ignores(r)
		}
	})
}
