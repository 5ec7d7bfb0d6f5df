//! `cublasGemmEx` on the CPU, with its column-major contract: `C = alpha · op(A) · op(B) + beta ·
//! C`, op(A) `m × k`, op(B) `k × n`, C `m × n`, every matrix column-major with its leading
//! dimension, inputs f32 or bf16 (read exactly: the values are already bf16), compute and output
//! f32 (`CUBLAS_COMPUTE_32F`). C is not read when beta is 0, as cuBLAS does not. Each operand's
//! span is checked against its allocation before the call is queued, so a wrong argument order
//! either fails that check or computes a different product, which the oracle catches.

/// Element type of A and B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmType {
    F32,
    Bf16,
}

impl GemmType {
    pub fn bytes(self) -> usize {
        match self {
            GemmType::F32 => 4,
            GemmType::Bf16 => 2,
        }
    }
}

/// One call, addresses resolved.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
    pub ab_type: GemmType,
    pub a: usize,
    pub lda: usize,
    pub b: usize,
    pub ldb: usize,
    pub c: usize,
    pub ldc: usize,
}

/// Elements a column-major `rows × cols` matrix with leading dimension `ld` spans, or why the
/// arguments are invalid (cuBLAS's `CUBLAS_STATUS_INVALID_VALUE` cases).
pub fn span(rows: usize, cols: usize, ld: usize, what: &str) -> Result<usize, String> {
    if ld < rows.max(1) {
        return Err(format!("{what}: leading dimension {ld} < rows {rows}"));
    }
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    (cols - 1)
        .checked_mul(ld)
        .and_then(|x| x.checked_add(rows))
        .ok_or_else(|| format!("{what}: span overflows"))
}

impl Gemm {
    /// (A, B, C) spans in elements.
    pub fn spans(&self) -> Result<(usize, usize, usize), String> {
        let (ar, ac) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (br, bc) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        Ok((
            span(ar, ac, self.lda, "GemmEx A")?,
            span(br, bc, self.ldb, "GemmEx B")?,
            span(self.m, self.n, self.ldc, "GemmEx C")?,
        ))
    }

    /// # Safety
    /// `a`, `b` and `c` address at least [`spans`](Self::spans) elements each, live and not
    /// written by anyone else during the call.
    pub unsafe fn run(&self) {
        let g = *self;
        if g.m == 0 || g.n == 0 {
            return;
        }
        let Ok((sa, sb, _)) = g.spans() else {
            return;
        };
        // bf16 operands widened to f32 (exact); f32 ones read in place.
        let widen = |base: usize, span: usize| -> Vec<f32> {
            // SAFETY: `span` elements at `base` (caller's contract).
            let bits = unsafe { std::slice::from_raw_parts(base as *const u16, span) };
            bits.iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect()
        };
        let (wa, wb);
        let (pa, pb) = match g.ab_type {
            GemmType::F32 => (g.a as *const f32, g.b as *const f32),
            GemmType::Bf16 => {
                wa = widen(g.a, sa);
                wb = widen(g.b, sb);
                (wa.as_ptr(), wb.as_ptr())
            }
        };
        // Column-major element (i, p) of op(A): A[i + p·lda], or A[p + i·lda] transposed.
        let (rsa, csa) = if g.trans_a { (g.lda, 1) } else { (1, g.lda) };
        let (rsb, csb) = if g.trans_b { (g.ldb, 1) } else { (1, g.ldb) };
        if g.k == 0 {
            for j in 0..g.n {
                for i in 0..g.m {
                    // SAFETY: inside C's span.
                    let cp = unsafe { (g.c as *mut f32).add(i + j * g.ldc) };
                    // SAFETY: as above.
                    unsafe { *cp = if g.beta == 0.0 { 0.0 } else { g.beta * *cp } };
                }
            }
            return;
        }
        // SAFETY: every index matrixmultiply forms lies inside the spans checked by the caller;
        // with beta 0 it does not read C (as cuBLAS does not).
        unsafe {
            matrixmultiply::sgemm(
                g.m,
                g.k,
                g.n,
                g.alpha,
                pa,
                rsa as isize,
                csa as isize,
                pb,
                rsb as isize,
                csb as isize,
                g.beta,
                g.c as *mut f32,
                1,
                g.ldc as isize,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_major_with_transposes_and_leading_dimensions() {
        // Row-major X[2x3] is column-major X^T[3x2] with ld 3.
        let x = [1f32, 2., 3., 4., 5., 6.]; // rows (1 2 3), (4 5 6)
        let w = [1f32, 0., 0., 1., 1., 1.]; // row-major [3x2]: (1 0), (0 1), (1 1)
        let mut c = [f32::NAN; 4];
        // Row-major C[2x2] = X·W, as column-major C^T = W^T · X^T: m=2 (W cols), n=2, k=3.
        let g = Gemm {
            trans_a: false,
            trans_b: false,
            m: 2,
            n: 2,
            k: 3,
            alpha: 1.0,
            beta: 0.0,
            ab_type: GemmType::F32,
            a: w.as_ptr() as usize,
            lda: 2,
            b: x.as_ptr() as usize,
            ldb: 3,
            c: c.as_mut_ptr() as usize,
            ldc: 2,
        };
        assert_eq!(g.spans().unwrap(), (6, 6, 4));
        // SAFETY: every span fits its array.
        unsafe { g.run() };
        assert_eq!(c, [4., 5., 10., 11.]);
        // The same product with A transposed in storage.
        let wt = [1f32, 0., 1., 0., 1., 1.]; // W^T row-major [2x3] = column-major W [3x2], ld 3
        let mut c2 = [f32::NAN; 4];
        let g2 = Gemm {
            trans_a: true,
            a: wt.as_ptr() as usize,
            lda: 3,
            c: c2.as_mut_ptr() as usize,
            ..g
        };
        // SAFETY: as above.
        unsafe { g2.run() };
        assert_eq!(c2, c);
        assert!(span(3, 2, 2, "A").is_err(), "ld below rows is invalid");
    }
}
