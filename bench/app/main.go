package main

import (
	"os"

	"github.com/activator/activator/internal/demoapp"
)

func main() { os.Exit(demoapp.Main()) }
