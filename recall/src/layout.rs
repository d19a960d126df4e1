//! The index's layout: the fields each passage is stored under, and its sentence
//! vectors, kept as 8-bit integers in a column of each segment (a fast field, read
//! without the stored documents).

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
    pub(crate) tokens: Field,
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
        vector: b.add_bytes_field("vector", FAST),
        tokens: b.add_bytes_field("tokens", STORED),
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

/// Levels each side of 0 a token state's value is kept at: 4 bits a value. Late
/// interaction ranks as with 8 bits in half the bytes (every evidence turn within 10
/// for 80.2% of LoCoMo's development questions either way, each repeat of a piece
/// kept; 79.6% with the sign alone, 79.2% and 79.0% with one and three levels).
const TOKEN_LEVELS: f32 = 7.0;

/// Token states (each a unit vector `dims` wide, `dims` even) as one blob: each a
/// little-endian f32 scale, then its values at 4 bits, two a byte (the first in the low
/// half), each stored as its level plus 8.
pub(crate) fn quantize_tokens(states: &[Vec<f32>]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in states {
        let max = s.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
        let scale = max / TOKEN_LEVELS;
        out.extend_from_slice(&scale.to_le_bytes());
        let level =
            |x: f32| ((x / scale).round().clamp(-TOKEN_LEVELS, TOKEN_LEVELS) as i8 + 8) as u8;
        out.extend(
            s.chunks(2)
                .map(|p| level(p[0]) | level(p.get(1).copied().unwrap_or(0.0)) << 4),
        );
    }
    out
}

/// Late interaction (ColBERT's MaxSim) of a question's telling tokens with a passage's
/// stored ones ([`quantize_tokens`], `dims` wide): for each question token the
/// similarity of the passage token most like it (0 at least), averaged. `None` when
/// either side has no token or the blob is not whole tokens.
pub(crate) fn late_similarity(stored: &[u8], dims: usize, question: &[Vec<f32>]) -> Option<f32> {
    let width = 4 + dims.div_ceil(2);
    if question.is_empty() || stored.is_empty() || !stored.len().is_multiple_of(width) {
        return None;
    }
    let tokens: Vec<(f32, Vec<i8>)> = stored
        .chunks_exact(width)
        .map(|t| {
            let scale = f32::from_le_bytes(t[..4].try_into().expect("4 bytes"));
            let values = t[4..]
                .iter()
                .flat_map(|&b| [(b & 0x0f) as i8 - 8, (b >> 4) as i8 - 8])
                .take(dims)
                .collect();
            (scale, values)
        })
        .collect();
    let total: f32 = question
        .iter()
        .map(|q| {
            tokens
                .iter()
                .map(|(scale, v)| scale * dot_i8(v, q))
                .fold(0f32, f32::max)
        })
        .sum();
    Some(total / question.len() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    #[test]
    fn late_similarity_takes_each_question_token_s_best_match() {
        let dims = 384;
        // Three passage tokens: two along axes, one spread over every dimension.
        let axis = |i: usize| unit((0..dims).map(|d| f32::from(d == i)).collect());
        let spread = unit((0..dims).map(|d| ((d * 37) % 11) as f32 - 5.0).collect());
        let stored = quantize_tokens(&[axis(0), axis(1), spread.clone()]);
        assert_eq!(stored.len(), 3 * (4 + dims / 2));
        // A question token equal to a stored one finds it, at 4 bits' precision.
        let s = late_similarity(&stored, dims, std::slice::from_ref(&spread)).unwrap();
        assert!((s - 1.0).abs() < 0.02, "{s}");
        // Two question tokens: one matching an axis, one that no stored token is like
        // (its similarities 0 or negative, counted as 0): the mean of 1 and 0.
        let away: Vec<f32> = axis(2).iter().map(|x| -x).collect();
        assert!(dot(&away, &spread) < 0.0);
        let s = late_similarity(&stored, dims, &[axis(1), away]).unwrap();
        assert!((s - 0.5).abs() < 0.02, "{s}");
        // Nothing to compare, or a cut blob: no similarity.
        assert_eq!(late_similarity(&stored, dims, &[]), None);
        assert_eq!(late_similarity(&[], dims, &[axis(0)]), None);
        assert_eq!(late_similarity(&stored[1..], dims, &[axis(0)]), None);
    }
}
