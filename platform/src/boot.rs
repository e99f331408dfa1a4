//! Entry: the PVH ELF note QEMU's `-kernel` looks for, and the 32-bit → 64-bit trampoline.
//!
//! QEMU enters `_start32` in 32-bit protected mode, paging off, `ebx` = physical address of the
//! `hvm_start_info`. The trampoline zeroes .bss, identity-maps 0–4 GiB with 2 MiB pages (the
//! PCI hole at 3–4 GiB uncached: PCD|PWT), enables PAE, long mode, paging and SSE (the
//! precompiled `core` uses it), loads a GDT with a 64-bit code segment, turns the AVX state on
//! where the processor has it (XSAVE and AVX: the driver's checksum uses the AVX encoding of
//! its instructions then), and calls `kmain(start_info)` on its own stack.

core::arch::global_asm!(
    r#"
    .section .note.pvh, "a"
    .balign 4
    .long 4                 /* name size: "Xen\0" */
    .long 4                 /* descriptor size */
    .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long _start32

    .section .text.boot, "ax"
    .code32
    .globl _start32
_start32:
    cli
    cld
    movl %ebx, %ebp                     /* hvm_start_info */
    movl $__bss_start, %edi
    movl $__bss_end, %ecx
    subl %edi, %ecx
    shrl $2, %ecx
    xorl %eax, %eax
    rep stosl
    movl $boot_pdpt, %eax
    orl $3, %eax
    movl %eax, boot_pml4
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $12, %eax
    addl $boot_pd, %eax
    orl $3, %eax
    movl %eax, boot_pdpt(,%ecx,8)
    incl %ecx
    cmpl $4, %ecx
    jne 1b
    xorl %ecx, %ecx
2:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax                     /* present, writable, 2 MiB page */
    cmpl $1536, %ecx                    /* 3 GiB and up: the PCI hole */
    jb 3f
    orl $0x18, %eax                     /* PCD | PWT: uncached */
3:  movl %eax, boot_pd(,%ecx,8)
    incl %ecx
    cmpl $2048, %ecx
    jne 2b
    movl %cr4, %eax
    orl $0x620, %eax                    /* PAE | OSFXSR | OSXMMEXCPT */
    movl %eax, %cr4
    movl $boot_pml4, %eax
    movl %eax, %cr3
    movl $0xC0000080, %ecx              /* EFER */
    rdmsr
    orl $0x100, %eax                    /* LME */
    wrmsr
    movl %cr0, %eax
    andl $0xFFFFFFF3, %eax              /* clear EM, TS */
    orl $0x80000003, %eax               /* PG | MP | PE */
    movl %eax, %cr0
    lgdt boot_gdt_ptr
    ljmp $0x08, $_start64

    .code64
_start64:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    /* Paint the stack, so that kmain can tell how deep it went. */
    movq $boot_stack, %rdi
    movq $(BOOT_STACK_SIZE / 8), %rcx
    movabsq $0x5AFE5AFE5AFE5AFE, %rax
    rep stosq
    movq $boot_stack_top, %rsp
    /* The AVX registers' state on where the processor has XSAVE and AVX (CPUID leaf 1, ECX
       bits 26 and 28): CR4.OSXSAVE, then XCR0 = x87 | SSE | AVX. The driver's checksum
       runs in the AVX encoding once it finds them on. */
    movl $1, %eax
    cpuid
    andl $0x14000000, %ecx
    cmpl $0x14000000, %ecx
    jne 5f
    movq %cr4, %rax
    orq $0x40000, %rax
    movq %rax, %cr4
    xorl %ecx, %ecx
    xorl %edx, %edx
    movl $7, %eax
    xsetbv
5:  movl %ebp, %edi
    call kmain
4:  hlt
    jmp 4b

    .section .rodata.boot, "a"
    .balign 8
boot_gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF            /* 0x08: 64-bit code */
    .quad 0x00CF92000000FFFF            /* 0x10: data */
boot_gdt_ptr:
    .word boot_gdt_ptr - boot_gdt - 1
    .long boot_gdt

    .section .bss.boot, "aw", @nobits
    .balign 4096
boot_pml4: .skip 4096
boot_pdpt: .skip 4096
boot_pd:   .skip 4096 * 4
    .globl boot_pd, boot_stack, boot_stack_top
    .set BOOT_STACK_SIZE, 2 * 1024 * 1024
boot_stack: .skip BOOT_STACK_SIZE
boot_stack_top:
"#,
    options(att_syntax)
);
