/*
 * The exec backing's shim as a static executable without libc: the protocol of package shim
 * (internal/backend/exec/shim/shim.go), which this program keeps exactly, in about a kilobyte of
 * machine code. build.sh compiles it into ../shim-linux-amd64, which package native embeds.
 *
 * Why: a listen_fds tenant's LISTEN_PID must be its own pid, which only a process between fork and
 * the tenant's exec can write. The activator's own binary does it in 2.4 ms here and /bin/sh in about
 * 0.8 ms (its dynamic linking and start); this program adds about 0.1 ms to the exec it wraps.
 *
 * Protocol (see shim.go for the authoritative words):
 *   argv: ARG0 PATH ARGV0 [ARG...]: exec PATH with argv ARGV0 [ARG...].
 *   ACTIVATOR_EXEC_SHIM: the mode; "exec" passes the environment on as it is, anything else
 *     (normally "1") sets LISTEN_PID to this process's pid, dropping any LISTEN_PID that came in.
 *   ACTIVATOR_EXEC_SHIM_GATE=N: before the exec, read descriptor N (decimal digits, 3 to 2^31-1) up
 *     to a newline and close it; end of file first exits with status 75 (the standby was dropped) and
 *     execs nothing. Empty: no gate.
 *   Both variables are removed from the tenant's environment; where one comes twice, the first
 *   counts, as Getenv reads it.
 *   Any failure prints one line on stderr naming it and exits with status 127.
 */

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_getpid 39
#define SYS_execve 59
#define SYS_exit_group 231
#define EINTR 4

#define CANCELLED 75
#define FAILED 127

static const char arg0[] = "activator-exec-shim";
static const char mode_var[] = "ACTIVATOR_EXEC_SHIM=";
static const char gate_var[] = "ACTIVATOR_EXEC_SHIM_GATE=";
static const char pid_var[] = "LISTEN_PID=";

static long sys3(long n, long a, long b, long c)
{
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return r;
}

static void __attribute__((noreturn)) quit(int code)
{
	for (;;)
		sys3(SYS_exit_group, code, 0, 0);
}

/* after returns the part of s after prefix p, or 0 when s does not start with p. */
static const char *after(const char *s, const char *p)
{
	while (*p)
		if (*s++ != *p++)
			return 0;
	return s;
}

/* say writes "activator-exec-shim: ", the parts and a newline to stderr, in one write. */
static void say(const char *a, const char *b, const char *c, const char *d)
{
	char line[512];
	long n = 0;
	const char *parts[] = {arg0, ": ", a, b, c, d};
	for (unsigned i = 0; i < sizeof parts / sizeof parts[0]; i++)
		for (const char *p = parts[i]; *p && n < (long)sizeof line - 1; p++)
			line[n++] = *p;
	line[n++] = '\n';
	sys3(SYS_write, 2, (long)line, n);
}

/* decimal writes v >= 0 into buf (at least 21 bytes), NUL-terminated, and returns buf. */
static char *decimal(long v, char *buf)
{
	char tmp[21];
	int n = 0;
	do
		tmp[n++] = '0' + v % 10;
	while ((v /= 10) && n < 20);
	char *p = buf;
	while (n)
		*p++ = tmp[--n];
	*p = 0;
	return buf;
}

/* errname is errno e's name as Go's syscall package words it, for the errors an exec can meet. */
static const char *errname(long e, char *buf)
{
	switch (e) {
	case 1: return "operation not permitted";
	case 2: return "no such file or directory";
	case 5: return "input/output error";
	case 7: return "argument list too long";
	case 8: return "exec format error";
	case 9: return "bad file descriptor";
	case 11: return "resource temporarily unavailable";
	case 12: return "cannot allocate memory";
	case 13: return "permission denied";
	case 14: return "bad address";
	case 20: return "not a directory";
	case 21: return "is a directory";
	case 22: return "invalid argument";
	case 23: return "too many open files in system";
	case 24: return "too many open files";
	case 26: return "text file busy";
	case 36: return "file name too long";
	case 40: return "too many levels of symbolic links";
	case 80: return "accessing a corrupted shared library";
	case 107: return "transport endpoint is not connected";
	}
	char num[21];
	const char *p = "errno ";
	char *q = buf;
	while (*p)
		*q++ = *p++;
	for (p = decimal(e, num); *p;)
		*q++ = *p++;
	*q = 0;
	return buf;
}

/* quoted writes s into buf (at least 4 * 64 + 8 bytes) between double quotes, as Go's %q writes
 * ASCII: \" and \\ escaped, \n \r \t by name, other control bytes as \xNN; at most 64 bytes of s,
 * then "...". Bytes from 0x80 up are copied as they are. */
static char *quoted(const char *s, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	char *q = buf;
	*q++ = '"';
	for (int i = 0; *s; s++, i++) {
		unsigned char c = (unsigned char)*s;
		if (i == 64) {
			*q++ = '.', *q++ = '.', *q++ = '.';
			break;
		}
		if (c == '"' || c == '\\')
			*q++ = '\\', *q++ = c;
		else if (c == '\n')
			*q++ = '\\', *q++ = 'n';
		else if (c == '\r')
			*q++ = '\\', *q++ = 'r';
		else if (c == '\t')
			*q++ = '\\', *q++ = 't';
		else if (c < 0x20 || c == 0x7f)
			*q++ = '\\', *q++ = 'x', *q++ = hex[c >> 4], *q++ = hex[c & 15];
		else
			*q++ = c;
	}
	*q++ = '"';
	*q = 0;
	return buf;
}

/* wait reads the gate descriptor fd up to a newline, then closes it; it returns only for a newline. */
static void wait_gate(const char *fd)
{
	long n = 0;
	for (const char *p = fd; *p; p++) {
		if (*p < '0' || *p > '9' || (n = n * 10 + (*p - '0')) > 2147483647) {
			n = -1;
			break;
		}
	}
	if (n < 3) {
		char buf[4 * 64 + 8];
		say(gate_var, quoted(fd, buf), " is not an inherited descriptor", "");
		quit(FAILED);
	}
	for (;;) {
		char c;
		long r = sys3(SYS_read, n, (long)&c, 1);
		if (r == -EINTR)
			continue;
		if (r < 0) {
			char buf[32];
			say("read the standby gate: ", errname(-r, buf), "", "");
			quit(FAILED);
		}
		if (r == 0)
			quit(CANCELLED);
		if (c == '\n')
			break;
	}
	sys3(SYS_close, n, 0, 0);
}

__attribute__((noreturn, used)) void shim_main(long *sp)
{
	long argc = sp[0];
	char **argv = (char **)(sp + 1);
	char **environ = argv + argc + 1;
	if (argc < 3) {
		say("usage: ", arg0, " PATH ARGV0 [ARG...] (started by the exec backing only)", "");
		quit(FAILED);
	}
	long n = 0;
	while (environ[n])
		n++;
	/* The tenant's environment is made in place, in the kernel's own array: each pass keeps entries
	 * at or before where it read them, and the LISTEN_PID added at the end needs two slots after the
	 * kept ones, which are at most environ[n] (its NULL) and environ[n + 1] (the first word of the
	 * auxiliary vector, which a program without libc never reads). An array on the stack beside it
	 * could overrun a stack limit the kernel's 128 KiB of strings already filled. */
	char **env = environ;
	const char *mode = 0, *gate = 0;
	long k = 0;
	for (long i = 0; i < n; i++) {
		const char *v;
		if ((v = after(environ[i], mode_var))) {
			if (!mode)
				mode = v;
		} else if ((v = after(environ[i], gate_var))) {
			if (!gate)
				gate = v;
		} else
			env[k++] = environ[i];
	}
	if (!mode)
		mode = "1";
	static char pid[sizeof pid_var + 21];
	if (!(mode[0] == 'e' && mode[1] == 'x' && mode[2] == 'e' && mode[3] == 'c' && mode[4] == 0)) {
		long j = 0;
		for (long i = 0; i < k; i++)
			if (!after(env[i], pid_var))
				env[j++] = env[i];
		k = j;
		const char *p = pid_var;
		char *q = pid;
		while (*p)
			*q++ = *p++;
		decimal(sys3(SYS_getpid, 0, 0, 0), q);
		env[k++] = pid;
	}
	env[k] = 0;
	if (gate && *gate) /* empty: none, as package shim reads it */
		wait_gate(gate);
	long r = sys3(SYS_execve, (long)argv[1], (long)(argv + 2), (long)env);
	char buf[32];
	say("exec ", argv[1], ": ", errname(-r, buf));
	quit(FAILED);
}

/* The entry point: the stack pointer is where the kernel put argc, argv and the environment. */
__asm__(".globl _start\n"
	"_start:\n"
	"	mov %rsp, %rdi\n"
	"	and $-16, %rsp\n"
	"	call shim_main\n");
