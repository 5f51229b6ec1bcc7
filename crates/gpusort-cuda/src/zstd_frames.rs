//! The frames of a zstd page, found by reading their headers and block headers on the host
//! (RFC 8878, section 3.1.1): nvCOMP's batched zstd decompresses one frame a buffer, while a
//! Parquet page may hold several joined (the `gpusort` tool's writer cuts a page into nvCOMP's
//! 64 KiB frames). [`zstd_frames`] says where each frame is and what it decompresses to, so
//! that each goes to nvCOMP as a buffer of its own, written where the frame before it ends.

/// One frame of a page: its bytes' offset and length in the page, and the size it
/// decompresses to where its header says it (`None`: the header leaves it out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub at: usize,
    pub len: usize,
    pub content: Option<u64>,
}

/// The magic number that starts a zstd frame.
const MAGIC: u32 = 0xFD2F_B528;

/// The frames of `page`, in order; an error where a frame is not a zstd frame (a skippable
/// frame included, which no Parquet writer makes) or runs past the page.
pub(crate) fn zstd_frames(page: &[u8]) -> Result<Vec<Frame>, String> {
    let mut frames = vec![];
    let mut at = 0;
    while at < page.len() || frames.is_empty() {
        let (len, content) =
            frame(&page[at..]).ok_or_else(|| format!("the zstd frame at byte {at} of a page does not parse"))?;
        frames.push(Frame { at, len, content });
        at += len;
    }
    Ok(frames)
}

/// The length of the frame `bytes` starts with, and its content size where its header has it.
fn frame(bytes: &[u8]) -> Option<(usize, Option<u64>)> {
    if u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) != MAGIC {
        return None;
    }
    // The frame header's descriptor: content size flag, single segment, checksum, dictionary.
    let descriptor = *bytes.get(4)?;
    let single_segment = descriptor & 0x20 != 0;
    let checksum = descriptor & 0x04 != 0;
    let mut p = 5 + usize::from(!single_segment) + [0, 1, 2, 4][usize::from(descriptor & 3)];
    let content_bytes = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let content = (content_bytes > 0)
        .then(|| {
            let mut v = [0u8; 8];
            v[..content_bytes].copy_from_slice(bytes.get(p..p + content_bytes)?);
            let v = u64::from_le_bytes(v);
            // A 2-byte size counts from 256.
            Some(if content_bytes == 2 { v + 256 } else { v })
        })
        .flatten();
    if content_bytes > 0 && content.is_none() {
        return None;
    }
    p += content_bytes;
    // Blocks: a 3-byte header each (last block, type, size); raw and compressed blocks hold
    // `size` bytes, an RLE block one.
    loop {
        let h = bytes.get(p..p + 3)?;
        let header = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
        let size = (header >> 3) as usize;
        p += 3 + match (header >> 1) & 3 {
            0 | 2 => size,
            1 => 1,
            _ => return None,
        };
        if p > bytes.len() {
            return None;
        }
        if header & 1 != 0 {
            break;
        }
    }
    p += if checksum { 4 } else { 0 };
    (p <= bytes.len()).then_some((p, content))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| b"furiously regular deposits "[i % 27] ^ (i / 1000) as u8)
            .collect()
    }

    /// Frames joined as the tool's writer joins nvCOMP's are found one by one, with their
    /// content sizes, whatever the level, size and checksum; what is not a frame, or is cut
    /// short, is an error.
    #[test]
    fn joined_frames_are_found_with_their_sizes() {
        let parts: Vec<Vec<u8>> = vec![text(65_536), text(65_536), vec![], text(300), vec![7; 200_000], text(1)];
        for (level, checksum) in [(1, false), (3, true), (19, false)] {
            let frames: Vec<Vec<u8>> = (parts.iter())
                .map(|p| {
                    let mut c = zstd::bulk::Compressor::new(level).unwrap();
                    c.include_checksum(checksum).unwrap();
                    c.compress(p).unwrap()
                })
                .collect();
            let page = frames.concat();
            let found = zstd_frames(&page).unwrap();
            assert_eq!(found.len(), parts.len());
            let mut at = 0;
            for ((f, bytes), part) in found.iter().zip(&frames).zip(&parts) {
                assert_eq!((f.at, f.len, f.content), (at, bytes.len(), Some(part.len() as u64)));
                at += bytes.len();
            }
            assert!(zstd_frames(&page[..page.len() - 1]).is_err(), "cut short");
        }
        // A streamed frame leaves its size out.
        let mut streamed = vec![];
        let mut encoder = zstd::stream::Encoder::new(&mut streamed, 3).unwrap();
        std::io::Write::write_all(&mut encoder, &text(100_000)).unwrap();
        encoder.finish().unwrap();
        let found = zstd_frames(&streamed).unwrap();
        assert_eq!((found.len(), found[0].content), (1, None));
        assert!(zstd_frames(b"not a frame").is_err());
        assert!(zstd_frames(&[]).is_err(), "a page holds a frame");
    }
}
