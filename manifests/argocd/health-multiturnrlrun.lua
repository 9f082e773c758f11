-- Argo CD health check for mtrl.dev/v1alpha1 MultiTurnRLRun.
--
-- Argo CD evaluates this with the live object as `obj` and reads `status` and `message` from
-- the table it returns. Written for Lua 5.1, the dialect of Argo CD's embedded gopher-lua, and
-- for the libraries Argo CD opens for an argocd-cm script: base (tostring, ipairs ...), table,
-- package and an os with time and date only. No string, math or io: `string.format` fails there.
-- argocd-cm-patch.yaml embeds this file verbatim; tests/argocd keeps the two identical.

-- Argo CD has one "Progressing" for every phase in which the run is still on its way.
local ON_ITS_WAY = { Pending = true, Provisioning = true, Running = true, Suspending = true,
                    Terminating = true }

local function find_condition(status, condition_type)
  if status.conditions == nil then
    return nil
  end
  for _, condition in ipairs(status.conditions) do
    if condition.type == condition_type then
      return condition
    end
  end
  return nil
end

-- "first: second", leaving out an empty part.
local function join(first, second)
  if first == nil or first == "" then
    return second or ""
  end
  if second == nil or second == "" then
    return first
  end
  return first .. ": " .. second
end

local function assess(run)
  local status = run.status
  if status == nil or status.phase == nil then
    return { status = "Progressing", message = "Waiting for the operator" }
  end
  -- Until the operator has acted on the latest spec, the phase describes an older one.
  local generation = run.metadata and run.metadata.generation
  local observed = status.observedGeneration
  if generation ~= nil and observed ~= nil and observed < generation then
    return { status = "Progressing", message = "Waiting for the operator to observe generation "
      .. tostring(generation) .. " (last observed " .. tostring(observed) .. ")" }
  end
  local phase = status.phase
  if ON_ITS_WAY[phase] then
    return { status = "Progressing", message = join(phase, status.message) }
  end
  if phase == "Succeeded" then
    return { status = "Healthy", message = join(phase, status.message) }
  end
  if phase == "Suspended" then
    return { status = "Suspended", message = join(phase, status.message) }
  end
  if phase == "Failed" then
    local failed = find_condition(status, "Failed")
    local reason = (failed ~= nil and failed.status == "True" and failed.reason) or phase
    return { status = "Degraded", message = join(reason, status.message) }
  end
  return { status = "Unknown", message = "Unknown phase " .. tostring(phase) }
end

local hs = assess(obj)
-- A collapse is a warning: training goes on, so the health stays what the phase says.
if obj.status ~= nil then
  local collapse = find_condition(obj.status, "RewardCollapse")
  if collapse ~= nil and collapse.status == "True" then
    hs.message = hs.message .. "; RewardCollapse: " .. join(collapse.reason, collapse.message)
  end
end
return hs
