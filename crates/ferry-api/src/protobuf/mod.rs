//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) into
//! JSON values. STUB: to be filled in.
