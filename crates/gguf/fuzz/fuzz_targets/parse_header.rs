//! libFuzzer target: `parse_header` on arbitrary bytes must return Ok or a typed Err, never
//! panic, and an Ok header must describe only bytes that exist.

#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer_gguf::{parse_header, Value};

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    match parse_header(data, len) {
        Err(e) => {
            // Every error renders.
            let _ = e.to_string();
        }
        Ok(h) => {
            assert!(h.alignment.is_power_of_two());
            assert!(h.data_offset.is_multiple_of(h.alignment));
            assert!(h.data_offset + h.data_size <= len.max(h.data_offset));
            for t in &h.tensors {
                let (row, rows) = t.rows();
                assert_eq!(row * rows, t.n_elements());
                let start = h.data_offset + t.offset;
                let end = start + t.n_bytes;
                assert!(end <= len, "tensor {} ends at {end} past {len}", t.name);
                let _ = &data[start as usize..end as usize];
            }
            for (k, v) in h.metadata.iter() {
                assert_eq!(h.metadata.get(k), Some(v));
                let _ = v.to_string();
                if let Value::Array(a) = v {
                    for i in 0..a.len().min(4) {
                        let _ = a.item_to_string(i);
                    }
                }
            }
        }
    }
});
