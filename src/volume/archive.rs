//! The stream `export` writes and `import` reads: a POSIX tar (pax) that
//! standard tools read, in three members, in this order:
//!
//! 1. `manifest.json`: the format and the volume's spec;
//! 2. `<uuid>.img`: the backing file as a sparse member (GNU sparse format
//!    1.0 in pax headers), so its holes are never in the stream and
//!    `tar -x` (GNU tar, bsdtar) makes a sparse file of it;
//! 3. `<uuid>.img.blake3`: BLAKE3 over the manifest's bytes followed by
//!    the data's BLAKE3 (lowercase hex), where the data's is over the
//!    image's data map and data (for each data range: `<offset> <length>\n`,
//!    then its bytes), so that a damaged or cut stream, manifest included,
//!    is refused before anything is registered. Hashing the holes too would
//!    make an export cost the volume's size, not its data; hashing the data
//!    once serves both sums (an import also compares the data's alone).
//!    BLAKE3, not SHA-256: one core hashes it several times faster than
//!    SHA-256 (even with the CPU's SHA instructions), so that export and
//!    import cost about their I/O, as tar does.
//!
//! The reader takes exactly what the writer makes; other tar streams are
//! refused with what was expected.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::sync::mpsc;

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

const BLOCK: usize = 512;
/// The name of the format, in the manifest.
pub const FORMAT: &str = "sparse-volume-export";
pub const VERSION: u32 = 1;
const MANIFEST: &str = "manifest.json";
/// The checksum member's name: the image's, and this.
const CHECKSUM_SUFFIX: &str = "blake3";
/// A manifest is small; a bigger member is not ours.
const MAX_TEXT_MEMBER: u64 = 1 << 20;
/// What one read or write of image data moves at most.
pub const CHUNK: usize = 4 << 20;

/// The volume's spec, as the manifest carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub uuid: String,
    pub name: Option<String>,
    /// `filesystem` or `block`.
    pub mode: String,
    pub fs_type: Option<String>,
    #[serde(default)]
    pub mkfs_options: Vec<String>,
    pub size: u64,
    pub sector_size: u32,
    pub read_only: bool,
    /// Attached at every boot where it is imported.
    #[serde(default = "attached_at_boot")]
    pub enabled: bool,
    /// `offline`, `frozen` or `crash-consistent`: how the instant was
    /// taken (an xfs taken in use keeps changes in its log).
    pub consistency: String,
    /// Bytes of data in the image (its holes not counted).
    pub data_bytes: u64,
}

fn attached_at_boot() -> bool {
    true
}

impl Manifest {
    pub fn image_name(&self) -> String {
        format!("{}.img", self.uuid)
    }
}

/// Writes an export stream to `out`.
pub struct Writer<W: Write> {
    out: W,
    /// The manifest's bytes, the start of the stream's checksum.
    manifest_text: Vec<u8>,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            manifest_text: Vec::new(),
        }
    }

    pub fn manifest(&mut self, manifest: &Manifest) -> Result<()> {
        let text = serde_json::to_vec_pretty(manifest).context("writing the manifest")?;
        self.manifest_text.clone_from(&text);
        self.member(MANIFEST, text.len() as u64)?;
        self.out.write_all(&text)?;
        self.pad(text.len() as u64)
    }

    /// The image: `ranges` ((offset, length), in order, within `size`)
    /// read through `read_at`; returns the checksum, which
    /// [`Writer::finish`] writes.
    pub fn image(
        &mut self,
        manifest: &Manifest,
        ranges: &[(u64, u64)],
        mut read_at: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> Result<String> {
        let name = manifest.image_name();
        let map = sparse_map(ranges, manifest.size);
        let data: u64 = ranges.iter().map(|(_, length)| length).sum();
        self.pax(
            &name,
            &[
                ("GNU.sparse.major", "1".to_string()),
                ("GNU.sparse.minor", "0".to_string()),
                ("GNU.sparse.name", name.clone()),
                ("GNU.sparse.realsize", manifest.size.to_string()),
            ],
        )?;
        let member_size = map.len() as u64 + data;
        self.member(&format!("GNUSparseFile.0/{name}"), member_size)?;
        self.out.write_all(&map)?;
        let out = &mut self.out;
        let ((), data_sum) = hashed_alongside(|hashing| {
            for &(offset, length) in ranges {
                hashing.hash(format!("{offset} {length}\n").into_bytes())?;
                let mut done = 0u64;
                while done < length {
                    let mut chunk = hashing.buffer((length - done).min(CHUNK as u64) as usize);
                    read_at(offset + done, &mut chunk)
                        .with_context(|| format!("reading the volume at byte {}", offset + done))?;
                    out.write_all(&chunk)?;
                    done += chunk.len() as u64;
                    hashing.hash(chunk)?;
                }
            }
            Ok(())
        })?;
        self.pad(member_size)?;
        Ok(stream_checksum(&self.manifest_text, &data_sum))
    }

    /// The checksum member and the end of the archive.
    pub fn finish(mut self, manifest: &Manifest, checksum: &str) -> Result<W> {
        let text = format!("{checksum}  {}\n", manifest.image_name());
        self.member(
            &format!("{}.{CHECKSUM_SUFFIX}", manifest.image_name()),
            text.len() as u64,
        )?;
        self.out.write_all(text.as_bytes())?;
        self.pad(text.len() as u64)?;
        self.out.write_all(&[0u8; 2 * BLOCK])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn member(&mut self, name: &str, size: u64) -> Result<()> {
        self.out.write_all(&header(name, size, b'0')?)?;
        Ok(())
    }

    fn pax(&mut self, name: &str, records: &[(&str, String)]) -> Result<()> {
        let mut text = Vec::new();
        for (key, value) in records {
            text.extend(pax_record(key, value));
        }
        self.out.write_all(&header(
            &format!("PaxHeaders.0/{name}"),
            text.len() as u64,
            b'x',
        )?)?;
        self.out.write_all(&text)?;
        self.pad(text.len() as u64)
    }

    fn pad(&mut self, written: u64) -> Result<()> {
        let rest = (BLOCK - (written % BLOCK as u64) as usize) % BLOCK;
        self.out.write_all(&vec![0u8; rest])?;
        Ok(())
    }
}

/// How many chunks may wait for the hashing thread: enough to keep it
/// busy while the next chunk is read, few enough to bound the memory.
const CHUNKS_IN_FLIGHT: usize = 2;

/// The BLAKE3 of what `work` hands to [`Hashing::hash`], computed on a
/// second thread while `work` goes on reading and writing: on two cores
/// an import or export then costs about its I/O alone, not I/O plus
/// hashing.
fn hashed_alongside<T>(work: impl FnOnce(&Hashing) -> Result<T>) -> Result<(T, String)> {
    std::thread::scope(|scope| {
        let (to_hash, hashed) = mpsc::sync_channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
        let (give_back, spare) = mpsc::channel::<Vec<u8>>();
        let hasher = scope.spawn(move || {
            let mut hash = blake3::Hasher::new();
            for bytes in hashed {
                hash.update(&bytes);
                // Gone only when `work` has ended: nothing to hand back to.
                let _ = give_back.send(bytes);
            }
            hash.finalize().to_hex().to_string()
        });
        let hashing = Hashing { to_hash, spare };
        let worked = work(&hashing);
        // Closing the channel ends the hasher.
        drop(hashing);
        let sum = hasher
            .join()
            .map_err(|_| anyhow::anyhow!("the hashing thread panicked"))?;
        Ok((worked?, sum))
    })
}

/// [`hashed_alongside`]'s side of the channel.
struct Hashing {
    to_hash: mpsc::SyncSender<Vec<u8>>,
    /// Buffers the hasher is done with, to read the next chunk into.
    spare: mpsc::Receiver<Vec<u8>>,
}

impl Hashing {
    /// A buffer of `length` bytes, one the hasher handed back if any.
    fn buffer(&self, length: usize) -> Vec<u8> {
        let mut buffer = self.spare.try_recv().unwrap_or_default();
        buffer.resize(length, 0);
        buffer
    }

    fn hash(&self, bytes: Vec<u8>) -> Result<()> {
        self.to_hash
            .send(bytes)
            .map_err(|_| anyhow::anyhow!("the hashing thread ended early"))
    }
}

/// The stream's checksum: over the manifest's bytes and the data's
/// checksum (see the module's comment).
fn stream_checksum(manifest_text: &[u8], data_checksum: &str) -> String {
    let mut hash = blake3::Hasher::new();
    hash.update(manifest_text);
    hash.update(data_checksum.as_bytes());
    hash.finalize().to_hex().to_string()
}

/// The data-only checksum ([`ImageSums::data`]) of a file's `ranges`,
/// read through `read_at`: equal for a file imported from a stream and
/// not written since.
pub fn data_checksum(
    ranges: &[(u64, u64)],
    mut read_at: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<String> {
    let mut hash = blake3::Hasher::new();
    let mut buffer = vec![0u8; CHUNK];
    for &(offset, length) in ranges {
        hash.update(format!("{offset} {length}\n").as_bytes());
        let mut done = 0u64;
        while done < length {
            let chunk = &mut buffer[..(length - done).min(CHUNK as u64) as usize];
            read_at(offset + done, chunk)
                .with_context(|| format!("reading at byte {}", offset + done))?;
            hash.update(&*chunk);
            done += chunk.len() as u64;
        }
    }
    Ok(hash.finalize().to_hex().to_string())
}

/// GNU sparse 1.0's map: the number of ranges, then each offset and
/// length, one decimal per line, padded to a whole block. A file that
/// ends in a hole ends with an empty range at its size, as GNU tar writes
/// it, so that the extracted file has its length.
fn sparse_map(ranges: &[(u64, u64)], size: u64) -> Vec<u8> {
    let mut entries: Vec<(u64, u64)> = ranges.to_vec();
    if entries.last().is_none_or(|(o, l)| o + l < size) {
        entries.push((size, 0));
    }
    let mut text = format!("{}\n", entries.len());
    for (offset, length) in &entries {
        text.push_str(&format!("{offset}\n{length}\n"));
    }
    let mut bytes = text.into_bytes();
    bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK, 0);
    bytes
}

/// `<length> <key>=<value>\n`, where the length counts itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut length = body.len() + 1;
    while format!("{length}{body}").len() != length {
        length += 1;
    }
    format!("{length}{body}").into_bytes()
}

/// A ustar header block for a regular file (`0`) or pax header (`x`).
fn header(name: &str, size: u64, kind: u8) -> Result<[u8; BLOCK]> {
    ensure!(name.len() < 100, "a member name of {} bytes", name.len());
    let mut block = [0u8; BLOCK];
    block[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut block[100..108], 0o600);
    octal(&mut block[108..116], 0);
    octal(&mut block[116..124], 0);
    octal(&mut block[124..136], size);
    octal(&mut block[136..148], 0);
    block[156] = kind;
    block[257..263].copy_from_slice(b"ustar\0");
    block[263..265].copy_from_slice(b"00");
    block[148..156].copy_from_slice(b"        ");
    let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
    block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    Ok(block)
}

/// Zero-padded octal, NUL-terminated, filling `field`. An 11-digit size
/// field holds up to 8 GiB; larger sizes are written in base-256 (the
/// first byte's high bit set), as GNU tar and POSIX pax readers accept.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() <= digits {
        field[..digits].copy_from_slice(text.as_bytes());
        field[digits] = 0;
        return;
    }
    field.fill(0);
    let bytes = value.to_be_bytes();
    let len = field.len();
    field[len - 8..].copy_from_slice(&bytes);
    field[0] |= 0x80;
}

fn parse_number(field: &[u8]) -> Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut value = u64::from(field[0] & 0x7f);
        for &byte in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(byte)))
                .context("a number too large")?;
        }
        return Ok(value);
    }
    let text: String = field
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).with_context(|| format!("{text:?} is not an octal number"))
}

/// One member as the reader found it.
struct Member {
    name: String,
    size: u64,
    pax: BTreeMap<String, String>,
}

/// Reads an export stream from `input`, member by member, in the
/// writer's order.
pub struct Reader<R: Read> {
    input: R,
    /// The manifest's bytes, the start of the stream's checksum.
    manifest_text: Vec<u8>,
    /// A whole header block was read.
    started: bool,
}

/// What [`Reader::image`] read: the stream's checksum so far (to compare
/// with [`Reader::checksum`]), and that of the data alone (to compare
/// with a file's, [`data_checksum`]).
pub struct ImageSums {
    pub stream: String,
    pub data: String,
}

impl<R: Read> Reader<R> {
    pub fn new(input: R) -> Self {
        Self {
            input,
            manifest_text: Vec::new(),
            started: false,
        }
    }

    pub fn manifest(&mut self) -> Result<Manifest> {
        let member = match self.next_member() {
            Ok(member) => member,
            Err(_) if !self.started => bail!("the stream is empty, or too short to be an export"),
            Err(error) => {
                return Err(error.context("not an export stream (it does not start as one)"))
            }
        };
        ensure!(
            member.name == MANIFEST && member.pax.is_empty(),
            "not an export stream: it starts with {:?}, not {MANIFEST}",
            member.name
        );
        let text = self.small_member(&member)?;
        self.manifest_text.clone_from(&text);
        let manifest: Manifest =
            serde_json::from_slice(&text).context("the export's manifest does not read")?;
        ensure!(
            manifest.format == FORMAT && manifest.version == VERSION,
            "the stream is {} version {}, not {FORMAT} version {VERSION}",
            manifest.format,
            manifest.version
        );
        Ok(manifest)
    }

    /// The image, each data range handed to `write_at`.
    pub fn image(
        &mut self,
        manifest: &Manifest,
        mut write_at: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<ImageSums> {
        let member = self.next_member()?;
        let name = manifest.image_name();
        let sparse = |key: &str| member.pax.get(key).map(String::as_str);
        ensure!(
            sparse("GNU.sparse.name") == Some(name.as_str())
                && sparse("GNU.sparse.major") == Some("1")
                && sparse("GNU.sparse.minor") == Some("0")
                && member.pax.len() == 4,
            "the stream's second member is {:?}, not the sparse image {name}",
            member.name
        );
        ensure!(
            sparse("GNU.sparse.realsize") == Some(manifest.size.to_string().as_str()),
            "the image's size differs from the manifest's"
        );
        let (ranges, map_bytes) = self.read_sparse_map(manifest.size, member.size)?;
        let data: u64 = ranges.iter().map(|(_, length)| length).sum();
        ensure!(
            map_bytes + data == member.size && data == manifest.data_bytes,
            "the image holds {} bytes of data, its headers say {} and the manifest {}",
            data,
            member.size.saturating_sub(map_bytes),
            manifest.data_bytes
        );
        let input = &mut self.input;
        let ((), data) = hashed_alongside(|hashing| {
            for &(offset, length) in ranges.iter().filter(|(_, length)| *length > 0) {
                hashing.hash(format!("{offset} {length}\n").into_bytes())?;
                let mut done = 0u64;
                while done < length {
                    let mut chunk = hashing.buffer((length - done).min(CHUNK as u64) as usize);
                    input
                        .read_exact(&mut chunk)
                        .context("the stream ends inside the image; nothing was imported")?;
                    write_at(offset + done, &chunk)?;
                    done += chunk.len() as u64;
                    hashing.hash(chunk)?;
                }
            }
            Ok(())
        })?;
        self.skip_padding(member.size)?;
        Ok(ImageSums {
            stream: stream_checksum(&self.manifest_text, &data),
            data,
        })
    }

    /// The checksum the writer recorded.
    pub fn checksum(&mut self, manifest: &Manifest) -> Result<String> {
        let member = self.next_member()?;
        let expected = format!("{}.{CHECKSUM_SUFFIX}", manifest.image_name());
        ensure!(
            member.name == expected,
            "the stream's third member is {:?}, not {expected}",
            member.name
        );
        let text =
            String::from_utf8(self.small_member(&member)?).context("the checksum is not text")?;
        let sum = text.split_whitespace().next().unwrap_or("").to_string();
        ensure!(
            sum.len() == 64 && sum.bytes().all(|b| b.is_ascii_hexdigit()),
            "the checksum member holds no BLAKE3 checksum"
        );
        // The archive's end, as tar requires it: a stream cut just here is
        // cut all the same.
        let mut end = [0u8; 2 * BLOCK];
        self.input
            .read_exact(&mut end)
            .context("the stream ends before the archive does; nothing was imported")?;
        ensure!(
            end.iter().all(|&b| b == 0),
            "the stream goes on after the export"
        );
        Ok(sum)
    }

    fn read_sparse_map(&mut self, size: u64, member_size: u64) -> Result<(Vec<(u64, u64)>, u64)> {
        let mut consumed = 0u64;
        let mut text = Vec::new();
        let mut line = |this: &mut Self| -> Result<u64> {
            text.clear();
            loop {
                let mut byte = [0u8];
                this.input
                    .read_exact(&mut byte)
                    .context("the stream ends inside the image's map")?;
                consumed += 1;
                if byte[0] == b'\n' {
                    break;
                }
                ensure!(text.len() < 24, "the image's map is damaged");
                text.push(byte[0]);
            }
            let number = std::str::from_utf8(&text).unwrap_or("");
            number
                .parse()
                .with_context(|| format!("the image's map holds {number:?}"))
        };
        let count = line(self)?;
        // Each entry takes four bytes of the member at least.
        ensure!(
            count <= member_size / 4 && count <= size / BLOCK as u64 + 2,
            "the image's map is damaged"
        );
        let mut ranges = Vec::new();
        let mut end = 0u64;
        for index in 0..count {
            let offset = line(self)?;
            let length = line(self)?;
            ensure!(
                offset >= end && offset.checked_add(length).is_some_and(|e| e <= size),
                "the image's map is damaged (range {offset}+{length})"
            );
            // Only the last entry may be empty: the file's length.
            ensure!(
                length > 0 || (index + 1 == count && offset == size),
                "the image's map is damaged (an empty range at {offset})"
            );
            end = offset + length;
            ranges.push((offset, length));
        }
        let padded = consumed.div_ceil(BLOCK as u64) * BLOCK as u64;
        self.discard(padded - consumed)?;
        Ok((ranges, padded))
    }

    fn next_member(&mut self) -> Result<Member> {
        let mut pax = BTreeMap::new();
        loop {
            let mut block = [0u8; BLOCK];
            self.input
                .read_exact(&mut block)
                .context("the stream ends before the export does")?;
            self.started = true;
            if block.iter().all(|&b| b == 0) {
                bail!("the archive ends before the export does");
            }
            let stored = parse_number(&block[148..156])?;
            let mut summed = block;
            summed[148..156].copy_from_slice(b"        ");
            let sum: u64 = summed.iter().map(|&b| u64::from(b)).sum();
            ensure!(sum == stored, "a damaged tar header (checksum)");
            let name: String = block[..100]
                .iter()
                .take_while(|&&b| b != 0)
                .map(|&b| b as char)
                .collect();
            let size = parse_number(&block[124..136])?;
            // A name in the ustar prefix would be another file to tar.
            ensure!(
                block[345..500].iter().all(|&b| b == 0),
                "a tar member named {name:?} with a prefix, which exports have not"
            );
            match block[156] {
                b'x' => {
                    ensure!(size <= MAX_TEXT_MEMBER, "a pax header of {size} bytes");
                    let member = Member {
                        name,
                        size,
                        pax: BTreeMap::new(),
                    };
                    let text = self.small_member(&member)?;
                    for (key, value) in parse_pax(&text)? {
                        // Only the sparse image's keys: a `path` or a
                        // `size` would make tar read another archive.
                        ensure!(
                            key.starts_with("GNU.sparse."),
                            "a pax record {key:?}, which exports have not"
                        );
                        pax.insert(key, value);
                    }
                }
                b'0' | 0 => return Ok(Member { name, size, pax }),
                other => bail!(
                    "a tar member of type {:?}, which exports have not",
                    other as char
                ),
            }
        }
    }

    fn small_member(&mut self, member: &Member) -> Result<Vec<u8>> {
        ensure!(
            member.size <= MAX_TEXT_MEMBER,
            "{} has {} bytes",
            member.name,
            member.size
        );
        let mut text = vec![0u8; member.size as usize];
        self.input
            .read_exact(&mut text)
            .with_context(|| format!("the stream ends inside {}", member.name))?;
        self.skip_padding(member.size)?;
        Ok(text)
    }

    fn skip_padding(&mut self, size: u64) -> Result<()> {
        let rest = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        self.discard(rest)
    }

    fn discard(&mut self, bytes: u64) -> Result<()> {
        let copied = io::copy(&mut (&mut self.input).take(bytes), &mut io::sink())?;
        ensure!(copied == bytes, "the stream ends early");
        Ok(())
    }
}

fn parse_pax(text: &[u8]) -> Result<Vec<(String, String)>> {
    let mut records = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|&b| b == b' ')
            .context("a damaged pax record")?;
        let length: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|n| n.parse().ok())
            .context("a damaged pax record length")?;
        ensure!(
            length > space + 1 && length <= rest.len(),
            "a damaged pax record"
        );
        let record = std::str::from_utf8(&rest[space + 1..length - 1])
            .context("a pax record that is not UTF-8")?;
        let (key, value) = record.split_once('=').context("a pax record without =")?;
        records.push((key.to_string(), value.to_string()));
        rest = &rest[length..];
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(size: u64, data_bytes: u64) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            uuid: "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
            name: Some("pg".into()),
            mode: "filesystem".into(),
            fs_type: Some("ext4".into()),
            mkfs_options: Vec::new(),
            size,
            sector_size: 512,
            read_only: false,
            enabled: true,
            consistency: "offline".into(),
            data_bytes,
        }
    }

    /// A stream of `image` (zeros where it has no data) with `ranges`.
    fn stream(image: &[u8], ranges: &[(u64, u64)]) -> (Manifest, Vec<u8>) {
        let data = ranges.iter().map(|(_, l)| l).sum();
        let manifest = manifest(image.len() as u64, data);
        let mut writer = Writer::new(Vec::new());
        writer.manifest(&manifest).unwrap();
        let sum = writer
            .image(&manifest, ranges, |offset, buffer| {
                buffer.copy_from_slice(&image[offset as usize..offset as usize + buffer.len()]);
                Ok(())
            })
            .unwrap();
        (manifest.clone(), writer.finish(&manifest, &sum).unwrap())
    }

    fn read_back(bytes: &[u8]) -> Result<(Manifest, Vec<u8>)> {
        let mut reader = Reader::new(bytes);
        let manifest = reader.manifest()?;
        let mut image = vec![0u8; manifest.size as usize];
        let sums = reader.image(&manifest, |offset, data| {
            image[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        })?;
        ensure!(
            reader.checksum(&manifest)? == sums.stream,
            "checksum mismatch"
        );
        Ok((manifest, image))
    }

    #[test]
    fn a_stream_reads_back_as_written_and_every_cut_is_refused() {
        let mut image = vec![0u8; 64 << 10];
        image[4096..8192].fill(7);
        image[40000..40100].fill(9);
        let (manifest, bytes) = stream(&image, &[(4096, 4096), (40000, 100)]);
        let (read, back) = read_back(&bytes).unwrap();
        assert_eq!(read, manifest);
        assert!(back == image);
        for cut in [0, 100, 512, 1024, 2000, bytes.len() - 1025] {
            assert!(read_back(&bytes[..cut]).is_err(), "cut at {cut} was taken");
        }
        // One flipped data byte: the checksum says so.
        let position = bytes.windows(4).position(|w| w == [9, 9, 9, 9]).unwrap();
        let mut damaged = bytes.clone();
        damaged[position] = 8;
        let error = read_back(&damaged).unwrap_err();
        assert!(format!("{error:#}").contains("checksum"), "{error:#}");
    }

    #[test]
    fn a_changed_manifest_or_a_crafted_header_is_refused() {
        let mut image = vec![0u8; 64 << 10];
        image[4096..8192].fill(7);
        let (_, bytes) = stream(&image, &[(4096, 4096)]);
        // The manifest is covered by the checksum.
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let at = text.find("\"read_only\": false").unwrap();
        let mut changed = bytes.clone();
        changed[at..at + 18].copy_from_slice(b"\"read_only\": true ");
        let error = read_back(&changed).unwrap_err();
        assert!(format!("{error:#}").contains("checksum"), "{error:#}");
        // A ustar prefix (another path for tar) is not taken.
        let mut prefixed = bytes.clone();
        prefixed[345..350].copy_from_slice(b"../..");
        let mut summed = prefixed[..BLOCK].to_vec();
        summed[148..156].copy_from_slice(b"        ");
        let sum: u32 = summed.iter().map(|&b| u32::from(b)).sum();
        prefixed[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let error = read_back(&prefixed).unwrap_err();
        assert!(format!("{error:#}").contains("prefix"), "{error:#}");
        // Not a stream at all.
        assert!(format!("{:#}", read_back(b"").unwrap_err()).contains("empty"));
        let error = read_back(&[b'x'; 2048]).unwrap_err();
        assert!(
            format!("{error:#}").contains("not an export stream"),
            "{error:#}"
        );
    }

    #[test]
    fn a_map_that_claims_more_ranges_than_its_member_holds_is_refused_at_once() {
        let mut reader = Reader::new(&b"99999999999\n"[..]);
        let error = reader.read_sparse_map(1 << 44, 512).unwrap_err();
        assert!(format!("{error:#}").contains("damaged"), "{error:#}");
    }

    #[test]
    fn records_and_numbers_are_as_tar_writes_them() {
        assert_eq!(pax_record("a", "b"), b"6 a=b\n");
        // The length counts its own digits.
        let long = "x".repeat(95);
        let record = pax_record("k", &long);
        assert_eq!(record.len(), 102);
        assert!(record.starts_with(b"102 k="));
        let mut field = [0u8; 12];
        octal(&mut field, 8 << 30);
        assert_eq!(parse_number(&field).unwrap(), 8 << 30);
        octal(&mut field, 1 << 40);
        assert_eq!(field[0] & 0x80, 0x80);
        assert_eq!(parse_number(&field).unwrap(), 1 << 40);
        assert_eq!(sparse_map(&[], 4096)[..8], *b"1\n4096\n0");
    }
}
