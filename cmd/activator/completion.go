package main

// Shell completion: `activator completion bash|zsh` prints a script that completes the subcommands,
// their flags, file names after --config and --token-file, and route names, which it asks the admin
// API for through `activator status --names` (with the --admin, --config and --token-file already on
// the command line), and the states after status --state.

import (
	"fmt"
	"os"
	"strings"

	"github.com/activator/activator/internal/activator"
)

// completionCommand is a subcommand as the completion scripts offer it.
type completionCommand struct {
	name   string
	flags  []string // every flag the subcommand parses (a test compares them with its -h)
	routes bool     // its argument is a route name
	words  []string // the fixed words its argument may be
}

var adminFlagNames = []string{"--admin", "--token-file", "--config"}

// stateNames are the values of status --state (the admin API's route states).
var stateNames = strings.Join(activator.StateNames(), " ")

// completionCommands is what the scripts complete; keep it in step with main's switch and usage.
var completionCommands = []completionCommand{
	{name: "serve", flags: []string{"--config", "--log-format", "--log-level", "--pprof"}},
	{name: "check", flags: []string{"--config"}},
	{name: "status", flags: append([]string{"--json", "--watch", "--interval", "--count", "--names", "--state", "--wide"}, adminFlagNames...), routes: true},
	{name: "wake", flags: adminFlagNames, routes: true},
	{name: "sleep", flags: adminFlagNames, routes: true},
	{name: "explain", flags: append([]string{"--last", "--json"}, adminFlagNames...), routes: true},
	{name: "demo", flags: []string{"--listen", "--admin", "--log-format", "--print-config"}},
	{name: "completion", words: []string{"bash", "zsh"}},
	{name: "help"},
}

func cmdCompletion(args []string) int {
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
		fmt.Fprintln(os.Stderr, "activator completion: want bash or zsh, as in: source <(activator completion bash)")
		return 2
	}
	if args[0] == "bash" {
		fmt.Print(bashCompletion())
	} else {
		fmt.Print(zshCompletion())
	}
	return 0
}

func commandNames() string {
	names := make([]string, len(completionCommands))
	for i, c := range completionCommands {
		names[i] = c.name
	}
	return strings.Join(names, " ")
}

func bashCompletion() string {
	var b strings.Builder
	b.WriteString(`# bash completion for activator: source <(activator completion bash)
_activator() {
	local cur="${COMP_WORDS[COMP_CWORD]}" prev="" cmd="${COMP_WORDS[1]}" i
	[ "$COMP_CWORD" -gt 0 ] && prev="${COMP_WORDS[COMP_CWORD-1]}"
	if [ "$COMP_CWORD" -le 1 ]; then
		COMPREPLY=($(compgen -W "` + commandNames() + `" -- "$cur"))
		return
	fi
	case "$prev" in
	--config|--token-file)
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	--state)
		COMPREPLY=($(compgen -W "` + stateNames + `" -- "$cur"))
		return
		;;
	--admin|--interval|--count|--last|--listen|--log-format|--log-level)
		return
		;;
	esac
	local flags="" words=""
	case "$cmd" in
`)
	for _, c := range completionCommands {
		words := strings.Join(c.words, " ")
		if c.routes {
			words = "@routes"
		}
		fmt.Fprintf(&b, "\t%s) flags=%q words=%q ;;\n", c.name, strings.Join(c.flags, " "), words)
	}
	b.WriteString(`	esac
	if [[ "$cur" == -* ]]; then
		COMPREPLY=($(compgen -W "$flags" -- "$cur"))
		return
	fi
	if [ "$words" = "@routes" ]; then
		local admin=()
		for ((i = 2; i < COMP_CWORD; i++)); do
			case "${COMP_WORDS[i]}" in
			--admin|--config|--token-file) admin+=("${COMP_WORDS[i]}" "${COMP_WORDS[i+1]}") ;;
			esac
		done
		words="$(activator status --names "${admin[@]}" 2>/dev/null)"
	fi
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -F _activator activator
`)
	return b.String()
}

func zshCompletion() string {
	var b strings.Builder
	b.WriteString(`#compdef activator
# zsh completion for activator: source <(activator completion zsh), or save it as _activator in $fpath
_activator() {
	if (( CURRENT == 2 )); then
		compadd -- ` + commandNames() + `
		return
	fi
	case ${words[CURRENT-1]} in
	--config|--token-file) _files; return ;;
	--state) compadd -- ` + stateNames + `; return ;;
	--admin|--interval|--count|--last|--listen|--log-format|--log-level) return ;;
	esac
	local -a flags choices
	local routes=0
	case ${words[2]} in
`)
	for _, c := range completionCommands {
		fmt.Fprintf(&b, "\t%s) flags=(%s); choices=(%s)", c.name, strings.Join(c.flags, " "), strings.Join(c.words, " "))
		if c.routes {
			b.WriteString("; routes=1")
		}
		b.WriteString(" ;;\n")
	}
	b.WriteString(`	esac
	if [[ ${words[CURRENT]} == -* ]]; then
		compadd -- $flags
		return
	fi
	if (( routes )); then
		local -a admin
		local i
		for (( i = 3; i < CURRENT; i++ )); do
			case ${words[i]} in
			--admin|--config|--token-file) admin+=(${words[i]} ${words[i+1]}) ;;
			esac
		done
		choices=(${(f)"$(activator status --names $admin 2>/dev/null)"})
	fi
	compadd -- $choices
}
if [[ ${funcstack[1]} == _activator ]]; then
	_activator "$@" # loaded from $fpath: this file is the function's body
else
	compdef _activator activator
fi
`)
	return b.String()
}
