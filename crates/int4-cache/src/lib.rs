//! Config-hash keys and the packed-artifact store.
//!
//! Repacking a checkpoint for a device is done once: this crate will key packed artifacts by a blake3 hash
//! of a canonical encoding of everything that shapes them (the normalised quantization config, the plan, the
//! layout version, the CPU features they depend on, the source checkpoint's identity) and store them so a
//! warm load is a checked memory map. Nothing is implemented yet.
#![deny(missing_docs)]
