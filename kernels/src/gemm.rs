//! Row-major f32 matrix products through `matrixmultiply`.
//!
//! Rows are computed independently and in the same order whatever the batch, so a token's
//! activations do not depend on which other tokens share its step: the paged and contiguous
//! runs schedule different batches, yet must produce bit-identical greedy streams.

use rayon::prelude::*;

use crate::error::{check_len, KernelError};

/// Rows per parallel task; below this many rows the product runs on the calling thread.
const ROWS_PER_TASK: usize = 16;

/// `c[m×n] = a[m×k] · b[k×n]`, all row-major. `c` need not be initialised.
pub fn matmul(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    check_len("gemm a", m * k, a.len())?;
    check_len("gemm b", k * n, b.len())?;
    check_len("gemm c", m * n, c.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0);
        return Ok(());
    }
    if m <= ROWS_PER_TASK {
        sgemm_rows(a, b, c, m, k, n);
    } else {
        c.par_chunks_mut(ROWS_PER_TASK * n)
            .zip(a.par_chunks(ROWS_PER_TASK * k))
            .for_each(|(c_rows, a_rows)| sgemm_rows(a_rows, b, c_rows, c_rows.len() / n, k, n));
    }
    Ok(())
}

fn sgemm_rows(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    debug_assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: the slices hold m×k, k×n and m×n elements (checked by `matmul`), addressed with
    // row-major strides; beta = 0 so `c` is only written.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
            }
        }
        c
    }

    #[test]
    fn matches_naive_and_rows_do_not_depend_on_batch() {
        let (m, k, n) = (37, 29, 23);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 37.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104729 % 97) as f32 - 48.0) / 41.0)
            .collect();
        let mut c = vec![f32::NAN; m * n];
        matmul(&a, &b, &mut c, m, k, n).expect("shapes");
        let r = naive(&a, &b, m, k, n);
        for (x, y) in c.iter().zip(&r) {
            assert!(
                (*x as f64 - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{x} vs {y}"
            );
        }
        for row in [0, 5, 36] {
            let mut one = vec![f32::NAN; n];
            matmul(&a[row * k..(row + 1) * k], &b, &mut one, 1, k, n).expect("shapes");
            assert_eq!(
                one,
                c[row * n..(row + 1) * n],
                "row {row} differs when computed alone"
            );
        }
    }
}
