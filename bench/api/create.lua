-- wrk script: POST one small object per request, each with a unique name.
-- Env: TOKEN (bearer token), KIND (configmaps | pods), RUN (a tag making names unique per run).
local kind = os.getenv("KIND") or "configmaps"
local token = os.getenv("TOKEN") or ""
local run = os.getenv("RUN") or "r"
local path = "/api/v1/namespaces/default/" .. kind
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  n = 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Accept"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. token
end

local function body(name)
  if kind == "pods" then
    return '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"' .. name ..
      '","labels":{"app":"bench","tier":"api"}},"spec":{"containers":[{"name":"c","image":"nginx","ports":[{"containerPort":80}]}]}}'
  end
  return '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"' .. name ..
    '","labels":{"app":"bench"}},"data":{"key":"value","other":"a somewhat longer value of about forty bytes"}}'
end

function request()
  n = n + 1
  return wrk.format(nil, path, nil, body(string.format("b-%s-%d-%d", run, tid, n)))
end

function response(status, headers, body)
  if status ~= 201 then
    errors = (errors or 0) + 1
    if (errors or 0) <= 3 then io.stderr:write("status " .. status .. ": " .. body:sub(1, 300) .. "\n") end
  end
end
