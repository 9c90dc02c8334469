package unit

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

func decodeYAML(t *testing.T, route, text string) (*Settings, error) {
	t.Helper()
	var node *yaml.Node
	if text != "" {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			t.Fatalf("yaml: %v", err)
		}
		node = doc.Content[0]
	}
	v, err := Decode(&registry.Route{Name: route}, node)
	if err != nil {
		return nil, err
	}
	return v.(*Settings), nil
}

func TestDecode(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want *Settings
	}{
		{"defaults", "name: app.service", &Settings{Unit: "app.service", Bus: BusSystem, Sleep: SleepStop}},
		{"template", "template: app@{name}.service", &Settings{Unit: "app@blog.service", Template: "app@{name}.service", Bus: BusSystem, Sleep: SleepStop}},
		{"everything", "name: web-1.service\nbus: user\nsleep: sigstop\nsocket: web-1.socket",
			&Settings{Unit: "web-1.service", Bus: BusUser, Sleep: SleepSIGSTOP, Socket: "web-1.socket"}},
		{"address", "name: a.service\nbus: unix:path=/run/user/1000/systemd/private\nsleep: freeze",
			&Settings{Unit: "a.service", Bus: "unix:path=/run/user/1000/systemd/private", Sleep: SleepFreeze}},
		{"escaped instance", `name: 'app@x\x2dy.service'`, &Settings{Unit: `app@x\x2dy.service`, Bus: BusSystem, Sleep: SleepStop}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := decodeYAML(t, "blog", c.yaml)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string // each problem's "key: fragment", in order
	}{
		{"missing block", "", []string{": missing"}},
		{"neither", "bus: user", []string{"name: missing"}},
		{"both", "name: a.service\ntemplate: a@{name}.service", []string{"template: set either name or template"}},
		{"unknown key", "name: a.service\nstop: now", []string{"stop: unknown key"}},
		{"not a service", "name: a.timer", []string{`name: "a.timer" is not a .service unit`}},
		{"bad char", "name: 'a b.service'", []string{`name: "a b.service" is not a valid unit name`}},
		{"smuggled path", "name: ../../etc/x.service", []string{"name: ", "not allowed"}},
		{"template unit", "name: app@.service", []string{"name: ", "is a template"}},
		{"leading at", "name: '@x.service'", []string{"name: ", "starts with '@'"}},
		{"too long", "name: " + strings.Repeat("a", 300) + ".service", []string{"name: ", "longer than 255"}},
		{"template without placeholder", "template: app.service", []string{"template: ", "exactly once"}},
		{"template twice", "template: '{name}@{name}.service'", []string{"template: ", "exactly once"}},
		{"template bad result", "template: '{name}.socket'", []string{"template: ", "is not a .service unit"}},
		{"sleep", "name: a.service\nsleep: hibernate", []string{`sleep: "hibernate" is not a sleep mode`}},
		{"bus", "name: a.service\nbus: tcp:host=x", []string{"bus: ", "private socket address"}},
		{"bus relative", "name: a.service\nbus: unix:path=run/x", []string{"bus: ", "absolute"}},
		{"socket", "name: a.service\nsocket: a.service", []string{`socket: "a.service" is not a .socket unit`}},
		{"all at once", "name: a.timer\nsleep: x\nbus: y\nsocket: z", []string{"name: ", "sleep: ", "bus: ", "socket: "}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeYAML(t, "blog", c.yaml)
			if err == nil {
				t.Fatal("Decode succeeded, want an error")
			}
			list := registry.Errors(err)
			var keys []string
			for _, e := range list {
				var re *registry.Error
				if !errors.As(e, &re) {
					t.Fatalf("problem %v is %T, want *registry.Error", e, e)
				}
				if c.yaml != "" && re.Line == 0 {
					t.Errorf("problem %q has no line", e)
				}
				keys = append(keys, re.Key+": "+re.Err.Error())
			}
			joined := strings.Join(keys, "\n")
			for _, w := range c.want {
				if !strings.Contains(joined, w) {
					t.Errorf("problems:\n%s\nwant one containing %q", joined, w)
				}
			}
			if c.name == "all at once" && len(list) != 4 {
				t.Errorf("got %d problems, want 4:\n%s", len(list), joined)
			}
		})
	}
}

func TestDecodeLines(t *testing.T) {
	_, err := decodeYAML(t, "blog", "name: a.service\nsleep: x\n")
	var re *registry.Error
	if !errors.As(err, &re) || re.Line != 2 || re.Key != "sleep" {
		t.Fatalf("got %#v, want key sleep on line 2", re)
	}
}

func TestDecodeThroughRegistry(t *testing.T) {
	cfg := `
routes:
  - name: blog
    host: blog.example.com
    upstream: 127.0.0.1:9000
    backing: unit
    unit:
      template: app@{name}.service
      sleep: nap
`
	_, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"unit": Decode})
	if err == nil {
		t.Fatal("Load succeeded")
	}
	if got := err.Error(); !strings.Contains(got, "line 9") || !strings.Contains(got, `route "blog"`) || !strings.Contains(got, "unit.sleep") {
		t.Fatalf("error %q should name line 9, the route and unit.sleep", got)
	}
	cfg = strings.Replace(cfg, "nap", "sigstop", 1)
	c, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"unit": Decode})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if s := c.Routes[0].Settings.(*Settings); s.Unit != "app@blog.service" || s.Sleep != SleepSIGSTOP {
		t.Fatalf("settings %+v", s)
	}
}
