/*
 * Runs one marker of qemu/roce/icount.c in a Linux guest of qemu/roce/lab.sh: `mark CODE`
 * (CODE in hex, 0..ffff) executes `nopl 0x4256CODE(%rax)`, which the counting plugin records
 * with the guest's instruction count at that moment. The marker's bytes carry the code, so
 * they are written into a fresh executable page (followed by `ret`) and called.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
    char *end = NULL;
    unsigned long code = argc == 2 ? strtoul(argv[1], &end, 16) : 0x10000;
    if (argc != 2 || !end || *end || code > 0xffff) {
        fprintf(stderr, "usage: mark CODE (hex, 0..ffff)\n");
        return 2;
    }
    unsigned char insn[] = {0x0f, 0x1f, 0x80, code & 0xff, code >> 8, 0x56, 0x42, 0xc3};
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        perror("mark: mmap");
        return 1;
    }
    memcpy(page, insn, sizeof insn);
    ((void (*)(void))page)();
    return 0;
}
