#!/bin/sh
# build-test-guest.sh builds the tiny guest the kvm backing's tests and benchmarks boot:
#
#   vmlinux      the Debian cloud kernel, decompressed to a plain ELF (boots 1-3 s faster under TCG)
#   initrd.img   a busybox-static initramfs: loads the virtio and power-button modules, brings eth0 up
#                as 10.0.2.15/24 (QEMU user networking), serves /www on port 80 with busybox httpd, and
#                powers off when the ACPI power button is pressed (QMP system_powerdown)
#   append       the kernel command line to boot it with on this host (includes tsc_early_khz)
#
# Output goes to $ACTIVATOR_GUEST_DIR, or .guest/ at the repository root (git-ignored). An existing,
# complete guest for the current kernel package is reused, so running the script again is cheap.
#
# Needs (Debian): apt-get, dpkg-deb, busybox-static, cpio, gzip, and the decompressor of the kernel's
# payload (lz4 for Debian 12's cloud kernel; xz-utils, zstd for others). readelf (binutils) is
# optional. Runs as root or as any user (apt-get download needs no privileges).
#
# Usage: scripts/build-test-guest.sh [-f]     (-f rebuilds even when a guest exists)
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${ACTIVATOR_GUEST_DIR:-$repo/.guest}
force=0
[ "${1:-}" = "-f" ] && force=1

log() { printf 'build-test-guest: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in apt-cache apt-get dpkg-deb cpio gzip; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done
bb=$(command -v busybox || true)
[ -n "$bb" ] || die "busybox not found (apt-get install -y busybox-static)"
# The initramfs has no libc: insist on a static busybox.
if command -v readelf >/dev/null 2>&1 && readelf -l "$bb" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "$bb is dynamically linked (apt-get install -y busybox-static)"
fi

# The current cloud kernel package, e.g. linux-image-6.1.0-57-cloud-amd64.
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
[ -n "$pkg" ] || die "cannot resolve linux-image-cloud-amd64 (run apt-get update?)"
kver=${pkg#linux-image-}

# The stamp is the kernel package and the initramfs's version: a guest built by an older script is
# rebuilt. init-2: the power button is opened before httpd starts. init-3: a test can ask for it late
# (activator_test.button_late). init-4: a test can have the guest print to its console without end
# (activator_test.chatter=1). init-5: and suspend itself to RAM (activator_test.suspend=SECONDS).
stamp="$pkg init-5"
if [ "$force" = 0 ] && [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
	[ -s "$out/vmlinux" ] && [ -s "$out/initrd.img" ] && [ -s "$out/append" ]; then
	log "reusing $out ($stamp)"
	exit 0
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
cd "$work"

log "downloading $pkg"
apt-get download -q "$pkg" >/dev/null 2>&1 || apt-get download "$pkg"
dpkg-deb -x ./"$pkg"_*.deb root
vmlinuz=root/boot/vmlinuz-$kver
moddir=root/lib/modules/$kver
[ -f "$vmlinuz" ] || die "$vmlinuz missing from the package"

# --- plain vmlinux, the way the kernel's scripts/extract-vmlinux does it: find each candidate
# compressed payload by its magic bytes, decompress from there, keep the first result that is an ELF.
is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' \n')" = '177ELF' ]; }
try_decompress() { # magic (printf octal escapes), search string for grep, command
	magic=$1
	shift
	for pos in $(LC_ALL=C grep -aboF "$(printf "$magic")" "$vmlinuz" 2>/dev/null | cut -d: -f1); do
		tail -c +"$((pos + 1))" "$vmlinuz" | "$@" >vmlinux.try 2>/dev/null || true
		if [ -s vmlinux.try ] && is_elf vmlinux.try; then
			mv vmlinux.try vmlinux
			return 0
		fi
	done
	rm -f vmlinux.try
	return 1
}
found=
for spec in \
	'\037\213\010|gzip -dc' \
	'\375\067\172\130\132\000|xz -dc' \
	'\050\265\057\375|zstd -dc' \
	'\002\041\114\030|lz4 -dc' \
	'\102\132\150|bzip2 -dc' \
	'\135\000\000|xz -dc --format=lzma'; do
	magic=${spec%%|*}
	cmd=${spec#*|}
	tool=${cmd%% *}
	command -v "$tool" >/dev/null 2>&1 || continue
	# shellcheck disable=SC2086 # cmd is a fixed word list above
	if try_decompress "$magic" $cmd; then
		found=$tool
		break
	fi
done
[ -n "$found" ] || die "no decompressible ELF payload found in $vmlinuz (is its decompressor installed? apt-get install -y lz4 xz-utils zstd)"
log "extracted vmlinux ($found payload, $(($(wc -c <vmlinux) / 1024 / 1024)) MiB)"

# --- modules, in dependency order, read from each module's .modinfo "depends=" (no kmod needed).
modpath() { # module name -> path relative to $moddir
	n=$(printf '%s' "$1" | tr '-' '_')
	p=$(find "$moddir/kernel" \( -name "$n.ko" -o -name "$(printf '%s' "$n" | tr '_' '-').ko" \) | head -n 1)
	[ -n "$p" ] || die "module $1 not found in $pkg"
	printf '%s\n' "${p#"$moddir"/}"
}
deps() { tr '\0' '\n' <"$moddir/$(modpath "$1")" | sed -n 's/^depends=//p' | tr ',' ' '; }
order=
add() { # depth-first: dependencies before the module
	case " $order " in *" $1 "*) return ;; esac
	for d in $(deps "$1"); do add "$d"; done
	order="$order $1"
}
for m in virtio_mmio virtio_pci virtio_net evdev button; do add "$m"; done
log "modules:$order"

mkdir -p initramfs/bin initramfs/lib/modules initramfs/www initramfs/proc initramfs/sys initramfs/dev initramfs/tmp
cp "$bb" initramfs/bin/busybox
: >initramfs/modules
for m in $order; do
	cp "$moddir/$(modpath "$m")" initramfs/lib/modules/"$m".ko
	echo "$m" >>initramfs/modules
done
cat >initramfs/www/index.html <<'EOF'
<!doctype html><title>activator test guest</title><p>activator-test-guest ok</p>
EOF
cat >initramfs/init <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules); do insmod /lib/modules/$m.ko; done
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
# /boot_id tells a cold boot from a resumed or restored guest.
cat /proc/sys/kernel/random/boot_id >/www/boot_id
# Power off on the ACPI power button (QMP system_powerdown): wait for one input event from it. The
# button's device is opened (fd 3) before httpd starts: evdev gives a reader only the events after its
# open, and a host that presses the button as soon as the guest answers must not press it unheard.
# activator_test.button_late=SECONDS on the kernel command line opens it that long after httpd starts
# instead, as in a guest whose power-button handler starts after its web server (TestPoweroffPressesAgain).
watch_button() {
	button=
	for n in /sys/class/input/event*; do
		grep -q 'Power Button' "$n/device/name" 2>/dev/null && button=/dev/${n##*/sys/class/}
	done
	if [ -n "$button" ]; then
		exec 3<"$button"
		(dd of=/dev/null bs=24 count=1 <&3 2>/dev/null
		 echo "activator-test-guest: power button, powering off"
		 poweroff -f) &
	else
		echo "activator-test-guest: no power button found"
	fi
}
late=$(sed -n 's/.*activator_test\.button_late=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
[ -z "$late" ] && watch_button
httpd -p 80 -h /www
echo "activator-test-guest: serving on 10.0.2.15:80"
# activator_test.chatter=1: print to the serial console without end, as a guest in a loop of errors
# does (TestConsoleLogCapped).
grep -q 'activator_test\.chatter=1' /proc/cmdline && yes "activator-test-guest chatter" >/dev/console &
# activator_test.suspend=SECONDS: suspend to RAM (ACPI S3) that long after httpd starts, as a guest
# with an idle-suspend policy does (TestGuestSuspendsItself; the machine must offer S3: pc or q35).
s3=$(sed -n 's/.*activator_test\.suspend=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$s3" ]; then
	(sleep "$s3"
	 echo "activator-test-guest: suspending to RAM (offered: $(cat /sys/power/state))"
	 echo mem >/sys/power/state
	 echo "activator-test-guest: resumed from suspend") &
fi
if [ -n "$late" ]; then
	sleep "$late"
	watch_button
	echo "activator-test-guest: power button opened ${late}s after httpd"
fi
while :; do sleep 3600; done
EOF
chmod 755 initramfs/init
(cd initramfs && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -6) >initrd.img

khz=$(awk '/^cpu MHz/ { printf "%d", $4 * 1000; exit }' /proc/cpuinfo)
append="console=ttyS0 quiet panic=-1 mitigations=off no_timer_check audit=0"
[ -n "$khz" ] && append="$append tsc_early_khz=$khz"
printf '%s\n' "$append" >append

mv vmlinux "$out/vmlinux"
mv initrd.img "$out/initrd.img"
mv append "$out/append"
printf '%s\n' "$stamp" >"$out/stamp"
log "built $out (kernel $kver): vmlinux initrd.img append"
