//! ferry-dns
