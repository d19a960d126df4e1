//! The index's layout: the fields each passage is stored under, and its sentence
//! vectors, kept as 8-bit integers beside each segment.

use super::*;

pub(crate) struct Fields {
    pub(crate) stream_id: Field,
    pub(crate) stream: Field,
    pub(crate) start: Field,
    pub(crate) end: Field,
    pub(crate) text: Field,
    pub(crate) source: Field,
    pub(crate) line: Field,
    pub(crate) time: Field,
    pub(crate) vector: Field,
}

/// A segment's passage vectors: int8 with one scale each, beside each passage's
/// document, stream and start.
pub(crate) struct SegmentVectors {
    pub(crate) docs: Vec<(DocId, u64, u64, f32)>,
    pub(crate) values: Vec<i8>,
    pub(crate) dims: usize,
}

pub(crate) fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let text_options = TextOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("en_stem")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        )
        .set_stored();
    let f = Fields {
        stream_id: b.add_u64_field("stream_id", INDEXED | STORED | FAST),
        stream: b.add_text_field("stream", STORED),
        start: b.add_u64_field("start", INDEXED | STORED | FAST),
        end: b.add_u64_field("end", STORED),
        text: b.add_text_field("text", text_options),
        source: b.add_text_field("source", STORED),
        line: b.add_u64_field("line", STORED),
        time: b.add_text_field("time", STORED),
        vector: b.add_bytes_field("vector", STORED),
    };
    (b.build(), f)
}

/// `q · v` for a stored int8 vector and the query's f32 one, summed in 16 lanes so the
/// compiler vectorises it (a single running sum must add in order, one at a time).
pub(crate) fn dot_i8(q: &[i8], v: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (qc, vc) = (q.chunks_exact(LANES), v.chunks_exact(LANES));
    let tail: f32 = qc
        .remainder()
        .iter()
        .zip(vc.remainder())
        .map(|(&a, &b)| a as f32 * b)
        .sum();
    for (qs, vs) in qc.zip(vc) {
        for l in 0..LANES {
            acc[l] += qs[l] as f32 * vs[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// A unit vector as int8 with its scale (little-endian f32 first).
pub(crate) fn quantize(v: &[f32]) -> Vec<u8> {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let scale = max / 127.0;
    let mut out = Vec::with_capacity(4 + v.len());
    out.extend_from_slice(&scale.to_le_bytes());
    out.extend(
        v.iter()
            .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8 as u8),
    );
    out
}
