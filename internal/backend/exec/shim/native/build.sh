#!/bin/sh
# Builds shim-linux-amd64 from csrc/shim.c: a static x86-64 executable with no libc, no PIE and no
# build id, so that the same compiler makes the same bytes (TestEmbeddedMatchesSource checks it where
# gcc is installed). Run it after editing csrc/shim.c, and commit both: `go generate ./internal/backend/exec/shim/native`.
set -eu
cd "$(dirname "$0")"
: "${CC:=gcc}"
out=shim-linux-amd64
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
$CC -std=c11 -Os -Wall -Wextra -Werror -static -nostdlib -nostartfiles -ffreestanding \
	-fno-pie -no-pie -fno-stack-protector -fno-asynchronous-unwind-tables -fno-unwind-tables \
	-fno-tree-loop-distribute-patterns -fno-ident -ffile-prefix-map="$PWD"=. \
	-Wl,--build-id=none -Wl,-z,noexecstack -Wl,-s -Wl,-z,norelro -Wl,-z,noseparate-code \
	-o "$tmp" csrc/shim.c
cp "$tmp" "$out"
chmod 0644 "$out"
