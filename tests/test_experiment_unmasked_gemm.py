"""lib.experiments.unmasked_gemm (chapter 4): the unmasked teaching kernel's counts, worked by hand (in Triton's
interpreter on the CPU)."""

from lib.experiments import unmasked_gemm


def test_unmasked_kernel_counts_worked_by_hand():
    """Tiles of 16: the first expert's tile covers rows 0-15 and, for N = 24, columns 0-31 (2 column
    tiles): 16 * 32 = 512 cells written, of which the output [8, 24] holds 8 * 24 = 192: 320 past it; its
    rows 5-7 are the second expert's: 3 * 24 = 72. With K = 20 every cell sums 12 products of the
    buffers' other data: all 192 wrong. Experts of 3 and 2 tokens, N = 16, K = 16: 256 written, 5 * 16 =
    80 inside, 176 past; rows 3-4 of the second expert: 32."""
    m = unmasked_gemm.masks_demo(Ms=[5, 3], N=24, K_whole=32, K_tail=20)
    assert (m["outside_cells"], m["next_cells"], m["wrong_cells"], m["cells"]) == (320, 72, 192, 192)
    m = unmasked_gemm.masks_demo(Ms=[3, 2], N=16, K_whole=16, K_tail=20)
    assert (m["outside_cells"], m["next_cells"], m["wrong_cells"], m["cells"]) == (176, 32, 80, 80)
    table = unmasked_gemm.masks_table(m)
    assert list(table["cells"]) == [176, 32, 80, 80]
