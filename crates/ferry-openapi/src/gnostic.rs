//! The subset of gnostic's `openapi.v2` protobuf messages (`openapiv2/OpenAPIv2.proto`) that a
//! Kubernetes Swagger 2.0 document needs, written by hand with the upstream field numbers, and the
//! conversion from Swagger JSON. Messages and fields that Ferry never emits are left out; decoders
//! skip unknown fields, so a full gnostic decoder reads these bytes as well.

// Oneofs hold their messages inline, as prost-generated code does.
#![allow(clippy::large_enum_variant)]

use serde_json::{Map, Value};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(string, tag = "3")]
    pub host: String,
    #[prost(string, tag = "4")]
    pub base_path: String,
    #[prost(string, repeated, tag = "5")]
    pub schemes: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub consumes: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub produces: Vec<String>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
    #[prost(message, repeated, tag = "16")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(message, repeated, tag = "7")]
    pub vendor_extension: Vec<NamedAny>,
}

/// A value kept as its YAML text (JSON text is valid YAML). Field 1 (`google.protobuf.Any`) is
/// never used by Kubernetes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "1")]
    pub vendor_extension: Vec<NamedAny>,
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PathItem {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "6")]
    pub options: Option<Operation>,
    #[prost(message, optional, tag = "7")]
    pub head: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, repeated, tag = "10")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "2")]
    pub summary: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(bool, tag = "11")]
    pub deprecated: bool,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ParametersItem {
    #[prost(oneof = "ParametersItemKind", tags = "1, 2")]
    pub oneof: Option<ParametersItemKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ParametersItemKind {
    #[prost(message, tag = "1")]
    Parameter(Parameter),
    #[prost(message, tag = "2")]
    JsonReference(JsonReference),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct JsonReference {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub description: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Parameter {
    #[prost(oneof = "ParameterKind", tags = "1, 2")]
    pub oneof: Option<ParameterKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ParameterKind {
    #[prost(message, tag = "1")]
    BodyParameter(BodyParameter),
    #[prost(message, tag = "2")]
    NonBodyParameter(NonBodyParameter),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
    #[prost(message, repeated, tag = "6")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NonBodyParameter {
    #[prost(oneof = "NonBodyParameterKind", tags = "3, 4")]
    pub oneof: Option<NonBodyParameterKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum NonBodyParameterKind {
    #[prost(message, tag = "3")]
    QueryParameterSubSchema(QueryParameterSubSchema),
    #[prost(message, tag = "4")]
    PathParameterSubSchema(PathParameterSubSchema),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(string, tag = "7")]
    pub format: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "23")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PathParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(string, tag = "6")]
    pub format: String,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "22")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
    #[prost(message, repeated, tag = "2")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseValue {
    #[prost(oneof = "ResponseValueKind", tags = "1, 2")]
    pub oneof: Option<ResponseValueKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ResponseValueKind {
    #[prost(message, tag = "1")]
    Response(Response),
    #[prost(message, tag = "2")]
    JsonReference(JsonReference),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
    #[prost(message, repeated, tag = "5")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SchemaItem {
    #[prost(oneof = "SchemaItemKind", tags = "1")]
    pub oneof: Option<SchemaItemKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SchemaItemKind {
    #[prost(message, tag = "1")]
    Schema(Schema),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "AdditionalPropertiesKind", tags = "1, 2")]
    pub oneof: Option<AdditionalPropertiesKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AdditionalPropertiesKind {
    #[prost(message, tag = "1")]
    Schema(Schema),
    #[prost(bool, tag = "2")]
    Boolean(bool),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "6")]
    pub multiple_of: f64,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(bool, tag = "8")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(bool, tag = "10")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(int64, tag = "17")]
    pub max_properties: i64,
    #[prost(int64, tag = "18")]
    pub min_properties: i64,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(string, tag = "26")]
    pub discriminator: String,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, optional, tag = "30")]
    pub example: Option<Any>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

// ---- Swagger JSON -> protobuf -------------------------------------------------------------------

fn s(m: &Map<String, Value>, key: &str) -> String {
    m.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn b(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn f(m: &Map<String, Value>, key: &str) -> f64 {
    m.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn i(m: &Map<String, Value>, key: &str) -> i64 {
    m.get(key).and_then(Value::as_i64).unwrap_or(0)
}

fn strings(m: &Map<String, Value>, key: &str) -> Vec<String> {
    match m.get(key) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// A value as YAML text. JSON is a subset of YAML, and Go's YAML decoders read it.
fn any(v: &Value) -> Any {
    Any {
        yaml: v.to_string(),
    }
}

/// The `x-…` keys of an object, as gnostic's vendor extensions.
fn extensions(m: &Map<String, Value>) -> Vec<NamedAny> {
    m.iter()
        .filter(|(k, _)| k.starts_with("x-"))
        .map(|(k, v)| NamedAny {
            name: k.clone(),
            value: Some(any(v)),
        })
        .collect()
}

fn obj(v: &Value) -> Option<&Map<String, Value>> {
    v.as_object()
}

/// Converts a Swagger 2.0 JSON document.
pub fn document(v: &Value) -> Document {
    let empty = Map::new();
    let m = obj(v).unwrap_or(&empty);
    let info = m.get("info").and_then(obj).map(|i| Info {
        title: s(i, "title"),
        version: s(i, "version"),
        description: s(i, "description"),
        vendor_extension: extensions(i),
    });
    let paths = m.get("paths").and_then(obj).map(|p| Paths {
        vendor_extension: extensions(p),
        path: p
            .iter()
            .filter(|(k, _)| !k.starts_with("x-"))
            .filter_map(|(k, v)| {
                obj(v).map(|item| NamedPathItem {
                    name: k.clone(),
                    value: Some(path_item(item)),
                })
            })
            .collect(),
    });
    let definitions = m.get("definitions").and_then(obj).map(|d| Definitions {
        additional_properties: named_schemas(d),
    });
    Document {
        swagger: s(m, "swagger"),
        info,
        host: s(m, "host"),
        base_path: s(m, "basePath"),
        schemes: strings(m, "schemes"),
        consumes: strings(m, "consumes"),
        produces: strings(m, "produces"),
        paths,
        definitions,
        vendor_extension: extensions(m),
    }
}

fn path_item(m: &Map<String, Value>) -> PathItem {
    let op = |key: &str| m.get(key).and_then(obj).map(operation);
    PathItem {
        r#ref: s(m, "$ref"),
        get: op("get"),
        put: op("put"),
        post: op("post"),
        delete: op("delete"),
        options: op("options"),
        head: op("head"),
        patch: op("patch"),
        parameters: parameters(m),
        vendor_extension: extensions(m),
    }
}

fn parameters(m: &Map<String, Value>) -> Vec<ParametersItem> {
    match m.get("parameters") {
        Some(Value::Array(a)) => a.iter().filter_map(obj).filter_map(parameter).collect(),
        _ => Vec::new(),
    }
}

fn parameter(p: &Map<String, Value>) -> Option<ParametersItem> {
    if p.contains_key("$ref") {
        let r = JsonReference {
            r#ref: s(p, "$ref"),
            description: s(p, "description"),
        };
        return Some(ParametersItem {
            oneof: Some(ParametersItemKind::JsonReference(r)),
        });
    }
    let kind = match p.get("in").and_then(Value::as_str) {
        Some("body") => ParameterKind::BodyParameter(BodyParameter {
            description: s(p, "description"),
            name: s(p, "name"),
            r#in: "body".into(),
            required: b(p, "required"),
            schema: p.get("schema").and_then(obj).map(schema),
            vendor_extension: extensions(p),
        }),
        Some("query") => ParameterKind::NonBodyParameter(NonBodyParameter {
            oneof: Some(NonBodyParameterKind::QueryParameterSubSchema(
                QueryParameterSubSchema {
                    required: b(p, "required"),
                    r#in: "query".into(),
                    description: s(p, "description"),
                    name: s(p, "name"),
                    r#type: s(p, "type"),
                    format: s(p, "format"),
                    unique_items: b(p, "uniqueItems"),
                    vendor_extension: extensions(p),
                },
            )),
        }),
        Some("path") => ParameterKind::NonBodyParameter(NonBodyParameter {
            oneof: Some(NonBodyParameterKind::PathParameterSubSchema(
                PathParameterSubSchema {
                    required: b(p, "required"),
                    r#in: "path".into(),
                    description: s(p, "description"),
                    name: s(p, "name"),
                    r#type: s(p, "type"),
                    format: s(p, "format"),
                    unique_items: b(p, "uniqueItems"),
                    vendor_extension: extensions(p),
                },
            )),
        }),
        // Header and form parameters are never emitted by Ferry.
        _ => return None,
    };
    Some(ParametersItem {
        oneof: Some(ParametersItemKind::Parameter(Parameter {
            oneof: Some(kind),
        })),
    })
}

fn operation(m: &Map<String, Value>) -> Operation {
    let responses = m.get("responses").and_then(obj).map(|r| Responses {
        response_code: r
            .iter()
            .filter(|(k, _)| !k.starts_with("x-"))
            .filter_map(|(code, v)| {
                obj(v).map(|v| NamedResponseValue {
                    name: code.clone(),
                    value: Some(response(v)),
                })
            })
            .collect(),
        vendor_extension: extensions(r),
    });
    Operation {
        tags: strings(m, "tags"),
        summary: s(m, "summary"),
        description: s(m, "description"),
        operation_id: s(m, "operationId"),
        produces: strings(m, "produces"),
        consumes: strings(m, "consumes"),
        parameters: parameters(m),
        responses,
        schemes: strings(m, "schemes"),
        deprecated: b(m, "deprecated"),
        vendor_extension: extensions(m),
    }
}

fn response(m: &Map<String, Value>) -> ResponseValue {
    if m.contains_key("$ref") {
        let r = JsonReference {
            r#ref: s(m, "$ref"),
            description: s(m, "description"),
        };
        return ResponseValue {
            oneof: Some(ResponseValueKind::JsonReference(r)),
        };
    }
    let r = Response {
        description: s(m, "description"),
        schema: m.get("schema").and_then(obj).map(|sc| SchemaItem {
            oneof: Some(SchemaItemKind::Schema(schema(sc))),
        }),
        vendor_extension: extensions(m),
    };
    ResponseValue {
        oneof: Some(ResponseValueKind::Response(r)),
    }
}

fn named_schemas(m: &Map<String, Value>) -> Vec<NamedSchema> {
    m.iter()
        .filter_map(|(k, v)| {
            obj(v).map(|v| NamedSchema {
                name: k.clone(),
                value: Some(schema(v)),
            })
        })
        .collect()
}

/// Converts one Swagger 2.0 schema object. Keywords Swagger 2.0 does not have are dropped.
pub fn schema(m: &Map<String, Value>) -> Schema {
    let r#type = match m.get("type") {
        Some(Value::String(t)) => Some(TypeItem {
            value: vec![t.clone()],
        }),
        Some(Value::Array(a)) => Some(TypeItem {
            value: a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        }),
        _ => None,
    };
    let items = match m.get("items") {
        Some(Value::Object(o)) => Some(ItemsItem {
            schema: vec![schema(o)],
        }),
        Some(Value::Array(a)) => Some(ItemsItem {
            schema: a.iter().filter_map(obj).map(schema).collect(),
        }),
        _ => None,
    };
    let additional_properties = match m.get("additionalProperties") {
        Some(Value::Object(o)) => Some(Box::new(AdditionalPropertiesItem {
            oneof: Some(AdditionalPropertiesKind::Schema(schema(o))),
        })),
        Some(Value::Bool(v)) => Some(Box::new(AdditionalPropertiesItem {
            oneof: Some(AdditionalPropertiesKind::Boolean(*v)),
        })),
        _ => None,
    };
    Schema {
        r#ref: s(m, "$ref"),
        format: s(m, "format"),
        title: s(m, "title"),
        description: s(m, "description"),
        default: m.get("default").map(any),
        multiple_of: f(m, "multipleOf"),
        maximum: f(m, "maximum"),
        exclusive_maximum: b(m, "exclusiveMaximum"),
        minimum: f(m, "minimum"),
        exclusive_minimum: b(m, "exclusiveMinimum"),
        max_length: i(m, "maxLength"),
        min_length: i(m, "minLength"),
        pattern: s(m, "pattern"),
        max_items: i(m, "maxItems"),
        min_items: i(m, "minItems"),
        unique_items: b(m, "uniqueItems"),
        max_properties: i(m, "maxProperties"),
        min_properties: i(m, "minProperties"),
        required: strings(m, "required"),
        r#enum: match m.get("enum") {
            Some(Value::Array(a)) => a.iter().map(any).collect(),
            _ => Vec::new(),
        },
        additional_properties,
        r#type,
        items,
        all_of: match m.get("allOf") {
            Some(Value::Array(a)) => a.iter().filter_map(obj).map(schema).collect(),
            _ => Vec::new(),
        },
        properties: m.get("properties").and_then(obj).map(|p| Properties {
            additional_properties: named_schemas(p),
        }),
        discriminator: s(m, "discriminator"),
        read_only: b(m, "readOnly"),
        example: m.get("example").map(any),
        vendor_extension: extensions(m),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use serde_json::json;

    use super::*;

    #[test]
    fn schema_conversion_table() {
        let cases = [
            (
                json!({"type": "string", "format": "int-or-string"}),
                Schema {
                    r#type: Some(TypeItem {
                        value: vec!["string".into()],
                    }),
                    format: "int-or-string".into(),
                    ..Default::default()
                },
            ),
            (
                json!({"$ref": "#/definitions/A", "description": "d"}),
                Schema {
                    r#ref: "#/definitions/A".into(),
                    description: "d".into(),
                    ..Default::default()
                },
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                Schema {
                    r#type: Some(TypeItem {
                        value: vec!["object".into()],
                    }),
                    additional_properties: Some(Box::new(AdditionalPropertiesItem {
                        oneof: Some(AdditionalPropertiesKind::Schema(Schema {
                            r#type: Some(TypeItem {
                                value: vec!["string".into()],
                            }),
                            ..Default::default()
                        })),
                    })),
                    ..Default::default()
                },
            ),
            (
                json!({"type": "array", "items": {"type": "integer"}, "x-kubernetes-list-type": "set"}),
                Schema {
                    r#type: Some(TypeItem {
                        value: vec!["array".into()],
                    }),
                    items: Some(ItemsItem {
                        schema: vec![Schema {
                            r#type: Some(TypeItem {
                                value: vec!["integer".into()],
                            }),
                            ..Default::default()
                        }],
                    }),
                    vendor_extension: vec![NamedAny {
                        name: "x-kubernetes-list-type".into(),
                        value: Some(Any {
                            yaml: "\"set\"".into(),
                        }),
                    }],
                    ..Default::default()
                },
            ),
            (
                json!({"required": ["a", "b"], "properties": {"a": {"type": "boolean"}}}),
                Schema {
                    required: vec!["a".into(), "b".into()],
                    properties: Some(Properties {
                        additional_properties: vec![NamedSchema {
                            name: "a".into(),
                            value: Some(Schema {
                                r#type: Some(TypeItem {
                                    value: vec!["boolean".into()],
                                }),
                                ..Default::default()
                            }),
                        }],
                    }),
                    ..Default::default()
                },
            ),
        ];
        for (input, want) in cases {
            let got = schema(input.as_object().expect("object"));
            assert_eq!(got, want, "{input}");
            let bytes = got.encode_to_vec();
            assert_eq!(Schema::decode(bytes.as_slice()).expect("decodes"), want);
        }
    }

    #[test]
    fn parameters_are_typed_by_location() {
        let op = json!({"parameters": [
            {"name": "body", "in": "body", "required": true, "schema": {"$ref": "#/definitions/P"}},
            {"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": true},
            {"name": "name", "in": "path", "required": true, "type": "string"},
            {"$ref": "#/parameters/x"},
        ]});
        let got = operation(op.as_object().expect("object"));
        let kinds: Vec<&str> = got
            .parameters
            .iter()
            .map(|p| match &p.oneof {
                Some(ParametersItemKind::Parameter(Parameter {
                    oneof: Some(ParameterKind::BodyParameter(_)),
                })) => "body",
                Some(ParametersItemKind::Parameter(Parameter {
                    oneof: Some(ParameterKind::NonBodyParameter(n)),
                })) => match &n.oneof {
                    Some(NonBodyParameterKind::QueryParameterSubSchema(_)) => "query",
                    Some(NonBodyParameterKind::PathParameterSubSchema(_)) => "path",
                    None => "none",
                },
                Some(ParametersItemKind::JsonReference(_)) => "ref",
                _ => "none",
            })
            .collect();
        assert_eq!(kinds, ["body", "query", "path", "ref"]);
    }
}
