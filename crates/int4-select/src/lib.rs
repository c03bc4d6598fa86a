//! Hardware probe and path policy: which 4-bit path (W4A16, W4A8 on VNNI or AMX, portable fallback) a
//! device should take, and why every faster path was rejected.
//!
//! This crate will hold the CPUID/XCR0/AMX-permission probe (a plain-data snapshot that tests can replace
//! with real CPUs' recorded CPUID dumps) and the policy, a pure function of that snapshot, the checkpoint
//! kind and the user's priority. Nothing is implemented yet.
#![deny(missing_docs)]
