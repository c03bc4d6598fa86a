//! The streaming writer: a [`FileLayout`] fixed first, then each tensor's bytes at its offset.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use safetensors::Dtype;

/// One tensor of a file to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl TensorEntry {
    /// The tensor's length in bytes.
    pub fn len_bytes(&self) -> u64 {
        let elems: u64 = self.shape.iter().map(|&d| d as u64).product();
        elems * self.dtype.bitsize() as u64 / 8
    }
}

/// A file's layout, fixed before any data is written (module docs).
#[derive(Clone, Debug)]
pub struct FileLayout {
    entries: Vec<TensorEntry>,
    /// Each entry's offset from the start of the data section.
    offsets: Vec<u64>,
    header: Vec<u8>,
    data_len: u64,
}

impl FileLayout {
    /// The layout of a file holding `entries` (their order here is how [`FileWriter::write`] names them),
    /// with `metadata` as the header's `__metadata__` (omitted when empty).
    pub fn new(metadata: &[(&str, &str)], entries: Vec<TensorEntry>) -> Self {
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(entries[i].dtype.bitsize().max(8)));
        let mut offsets = vec![0u64; entries.len()];
        let mut data_len = 0u64;
        for i in order {
            offsets[i] = data_len;
            data_len += entries[i].len_bytes();
        }
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            let meta: serde_json::Map<String, serde_json::Value> =
                metadata.iter().map(|(k, v)| ((*k).to_string(), serde_json::Value::from(*v))).collect();
            header.insert("__metadata__".into(), meta.into());
        }
        for (e, &at) in entries.iter().zip(&offsets) {
            let dtype = serde_json::to_value(e.dtype).unwrap_or_else(|_| format!("{:?}", e.dtype).into());
            header.insert(
                e.name.clone(),
                serde_json::json!({"dtype": dtype, "shape": e.shape, "data_offsets": [at, at + e.len_bytes()]}),
            );
        }
        let mut header = serde_json::Value::Object(header).to_string().into_bytes();
        header.resize(header.len().div_ceil(8) * 8, b' ');
        FileLayout { entries, offsets, header, data_len }
    }

    /// The tensors, in the order given.
    pub fn entries(&self) -> &[TensorEntry] {
        &self.entries
    }

    /// Tensor `i`'s offset from the start of the file.
    pub fn file_offset(&self, i: usize) -> u64 {
        self.data_start() + self.offsets[i]
    }

    /// Where the data section starts: after the 8-byte header length and the header.
    pub fn data_start(&self) -> u64 {
        8 + self.header.len() as u64
    }

    /// The whole file's length.
    pub fn file_len(&self) -> u64 {
        self.data_start() + self.data_len
    }
}

/// A safetensors file being written to a [`FileLayout`] (module docs).
#[derive(Debug)]
pub struct FileWriter {
    out: BufWriter<File>,
    path: PathBuf,
    layout: FileLayout,
    /// Where the next byte written without a seek lands.
    pos: u64,
}

impl FileWriter {
    /// Creates `path` (replacing a file there) with `layout`'s header, sized to the whole file.
    pub fn create(path: &Path, layout: FileLayout) -> std::io::Result<Self> {
        let file = File::create(path)?;
        file.set_len(layout.file_len())?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(layout.header.len() as u64).to_le_bytes())?;
        out.write_all(&layout.header)?;
        let pos = layout.data_start();
        Ok(FileWriter { out, path: path.to_path_buf(), layout, pos })
    }

    /// The file's layout.
    pub fn layout(&self) -> &FileLayout {
        &self.layout
    }

    /// Writes `bytes` into tensor `tensor`, starting `at` bytes into it. Fails, writing nothing, when they
    /// would run past the tensor's end.
    pub fn write(&mut self, tensor: usize, at: u64, bytes: &[u8]) -> std::io::Result<()> {
        let entry = self.layout.entries.get(tensor).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no tensor {tensor} in the layout"))
        })?;
        let len = entry.len_bytes();
        if at.checked_add(bytes.len() as u64).is_none_or(|end| end > len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} bytes at {at} run past the end of {} ({len} bytes)", bytes.len(), entry.name),
            ));
        }
        let start = self.layout.file_offset(tensor) + at;
        if start != self.pos {
            self.out.seek(SeekFrom::Start(start))?;
        }
        self.out.write_all(bytes)?;
        self.pos = start + bytes.len() as u64;
        Ok(())
    }

    /// Flushes and syncs the file; returns its path.
    pub fn finish(self) -> std::io::Result<PathBuf> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_written_in_any_order_read_back_aligned() {
        let path = std::env::temp_dir().join(format!("int4-safetensors-{}.safetensors", std::process::id()));
        let entries = vec![
            TensorEntry { name: "bytes".into(), dtype: Dtype::U8, shape: vec![3] },
            TensorEntry { name: "halves".into(), dtype: Dtype::BF16, shape: vec![3] },
            TensorEntry { name: "floats".into(), dtype: Dtype::F32, shape: vec![2, 3] },
        ];
        let layout = FileLayout::new(&[("format", "pt")], entries);
        assert_eq!(layout.data_start() % 8, 0, "the data section starts 8-byte aligned");
        for (i, e) in layout.entries().iter().enumerate() {
            assert_eq!(layout.file_offset(i) % (e.dtype.bitsize() as u64 / 8), 0, "{} is aligned", e.name);
        }
        let floats: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let halves = [1u8, 2, 3, 4, 5, 6];
        let mut w = FileWriter::create(&path, layout).unwrap();
        w.write(2, 12, &floats[12..]).unwrap();
        w.write(0, 0, &[7, 8, 9]).unwrap();
        w.write(2, 0, &floats[..12]).unwrap();
        w.write(1, 0, &halves).unwrap();
        assert!(w.write(0, 2, &[1, 2]).is_err(), "past the tensor's end");
        assert!(w.write(3, 0, &[]).is_err(), "no such tensor");
        w.finish().unwrap();
        let data = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&data).unwrap();
        assert_eq!(st.tensor("floats").unwrap().data(), &floats[..]);
        assert_eq!(st.tensor("floats").unwrap().shape(), &[2, 3]);
        assert_eq!(st.tensor("halves").unwrap().data(), &halves[..]);
        assert_eq!(st.tensor("bytes").unwrap().data(), &[7, 8, 9]);
        std::fs::remove_file(&path).unwrap();
    }
}
