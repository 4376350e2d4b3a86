-- wrk script: etcd v3 puts through its JSON gateway (POST /v3/kv/put), one unique key per request,
-- a value the size of a stored ConfigMap. Env: RUN (tag), VALUE_BYTES (default 420).
local run = os.getenv("RUN") or "r"
local size = tonumber(os.getenv("VALUE_BYTES") or "420")
local next_id = 0
local b64chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

local function b64(data)
  return ((data:gsub(".", function(x)
    local r, b = "", x:byte()
    for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and "1" or "0") end
    return r
  end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
    if #x < 6 then return "" end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
    return b64chars:sub(c + 1, c + 1)
  end) .. ({ "", "==", "=" })[#data % 3 + 1])
end

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
end

function init(args)
  n = 0
  value = b64(string.rep("v", size))
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  n = n + 1
  local key = b64(string.format("/registry/configmaps/default/b-%s-%d-%d", run, tid, n))
  return wrk.format(nil, "/v3/kv/put", nil, '{"key":"' .. key .. '","value":"' .. value .. '"}')
end
