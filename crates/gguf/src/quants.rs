//! TEMPORARY stub of the quants module (engineer "quants" writes the real one): F32, F16 and
//! Q8_0 only, same API. Deleted when main has the real module.

use crate::{Error, GgmlType, Result};
use half::f16;

fn unsupported(ty: GgmlType) -> Error {
    Error::Invalid(format!("{ty} not in the quants stub"))
}

pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

pub fn f32_to_f16(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    match ty {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::Q8_0 => {
            for (d, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let s = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                for (j, v) in d.iter_mut().enumerate() {
                    *v = b[2 + j] as i8 as f32 * s;
                }
            }
        }
        _ => return Err(unsupported(ty)),
    }
    Ok(())
}

pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match ty {
        GgmlType::F32 => {
            for (x, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
                c.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                for (j, v) in x.iter().enumerate() {
                    b[2 + j] = (v * id).round_ties_even() as i8 as u8;
                }
            }
        }
        _ => return Err(unsupported(ty)),
    }
    Ok(())
}

pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q8_0 => GgmlType::Q8_0,
        _ => GgmlType::F32,
    }
}

pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32> {
    match ty {
        GgmlType::F32 | GgmlType::F16 => {
            let mut wf = vec![0f32; n];
            dequantize_row(ty, w, &mut wf)?;
            let mut s = 0f64;
            for (a, c) in wf.iter().zip(act.chunks_exact(4)) {
                s += (*a * f32::from_le_bytes([c[0], c[1], c[2], c[3]])) as f64;
            }
            Ok(s as f32)
        }
        GgmlType::Q8_0 => {
            let mut s = 0f32;
            for (a, b) in w.chunks_exact(34).zip(act.chunks_exact(34)) {
                let mut acc = 0i32;
                for j in 0..32 {
                    acc += (a[2 + j] as i8 as i32) * (b[2 + j] as i8 as i32);
                }
                let da = f16_to_f32(u16::from_le_bytes([a[0], a[1]]));
                let db = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                s += acc as f32 * da * db;
            }
            Ok(s)
        }
        _ => Err(unsupported(ty)),
    }
}
