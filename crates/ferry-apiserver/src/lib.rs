//! ferry-apiserver
