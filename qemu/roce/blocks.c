/* The NVMe-oF lab's writer and checker of generations (qemu/roce/nvmf.sh, `nvmf restart`),
 * run on Linux A against a namespace of the appliance.
 *
 *   blocks write DEV FIRST COUNT GEN BS   writes sectors FIRST..FIRST+COUNT-1 (512 bytes each)
 *                                         in order, BS bytes a write (O_DIRECT), each sector
 *                                         holding generation GEN's record of itself; fdatasync
 *                                         at the end; prints "written N" every 1 MiB
 *   blocks check DEV FIRST COUNT OLD NEW  reads them back (O_DIRECT) and prints
 *                                         "old A new B other C first-other S" (S: -1 if none)
 *
 * A sector of generation G is 32 records of 16 bytes, "g<G> <sector, 12 digits>\n" (G one
 * digit): old content and new content are told apart, and a sector of neither (torn inside a
 * sector, zero, another sector's data) is "other". Exit status 0 unless a call failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SECTOR 512
#define RECORD 16

static void fill(unsigned char *s, unsigned gen, unsigned long long sector)
{
	char rec[RECORD + 1];
	snprintf(rec, sizeof rec, "g%u %012llu\n", gen % 10, sector % 1000000000000ULL);
	for (int i = 0; i < SECTOR; i += RECORD)
		memcpy(s + i, rec, RECORD);
}

static int num(const char *s, unsigned long long *out)
{
	char *end;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno == 0 && end != s && *end == 0;
}

int main(int argc, char **argv)
{
	unsigned long long first, count, a, b, bs = 0;
	int wr = argc == 7 && strcmp(argv[1], "write") == 0;
	int ok = argc == 7 && (wr || strcmp(argv[1], "check") == 0) && num(argv[3], &first) &&
		 num(argv[4], &count) && num(argv[5], &a) && num(argv[6], &b) && a <= 9 &&
		 count <= (1ULL << 40) / SECTOR;
	if (ok && wr)
		ok = b > 0 && b % SECTOR == 0 && b <= (1 << 20);
	else if (ok)
		ok = b <= 9;
	if (!ok) {
		fprintf(stderr, "usage: blocks write DEV FIRST COUNT GEN BS | blocks check DEV FIRST COUNT OLD NEW\n");
		return 2;
	}
	bs = b;
	int fd = open(argv[2], (wr ? O_WRONLY : O_RDONLY) | O_DIRECT);
	if (fd < 0) {
		perror(argv[2]);
		return 1;
	}
	size_t chunk = wr ? bs : 1 << 16;
	unsigned char *buf, want_old[SECTOR], want_new[SECTOR];
	if (posix_memalign((void **)&buf, 4096, chunk)) {
		perror("posix_memalign");
		return 1;
	}
	unsigned long long old = 0, new = 0, other = 0, first_other = (unsigned long long)-1;
	unsigned long long done = 0, total = count * SECTOR;
	while (done < total) {
		size_t n = total - done < chunk ? total - done : chunk;
		off_t at = (off_t)(first * SECTOR + done);
		if (wr) {
			for (size_t i = 0; i < n; i += SECTOR)
				fill(buf + i, a, first + (done + i) / SECTOR);
			if (pwrite(fd, buf, n, at) != (ssize_t)n) {
				perror("pwrite");
				return 1;
			}
			if ((done + n) / (1 << 20) != done / (1 << 20)) {
				printf("written %llu\n", (done + n) / SECTOR);
				fflush(stdout);
			}
		} else {
			if (pread(fd, buf, n, at) != (ssize_t)n) {
				perror("pread");
				return 1;
			}
			for (size_t i = 0; i < n; i += SECTOR) {
				unsigned long long s = first + (done + i) / SECTOR;
				fill(want_old, a, s);
				fill(want_new, b, s);
				if (memcmp(buf + i, want_old, SECTOR) == 0)
					old++;
				else if (memcmp(buf + i, want_new, SECTOR) == 0)
					new++;
				else if (other++ == 0)
					first_other = s;
			}
		}
		done += n;
	}
	if (wr) {
		if (fdatasync(fd)) {
			perror("fdatasync");
			return 1;
		}
		printf("written %llu synced\n", count);
	} else {
		printf("old %llu new %llu other %llu first-other %lld\n", old, new, other,
		       (long long)first_other);
	}
	close(fd);
	return 0;
}
