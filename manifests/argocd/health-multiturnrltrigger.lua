-- Argo CD health check for mtrl.dev/v1alpha1 MultiTurnRLTrigger.
--
-- Argo CD evaluates this with the live object as `obj` and reads `status` and `message` from
-- the table it returns. Written for Lua 5.1, the dialect of Argo CD's embedded gopher-lua, and
-- for the libraries Argo CD opens for an argocd-cm script: base (tostring, ipairs ...), table,
-- package and an os with time and date only. No string, math or io: `string.format` fails there.
-- argocd-cm-patch.yaml embeds this file verbatim; tests/argocd keeps the two identical.
--
-- A trigger is healthy while it consumes its queue (condition Ready=True). Its runs have
-- health checks of their own: a failed run does not degrade the trigger that started it.

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

local function active_runs(status)
  local active = status.activeCount or 0
  if active == 1 then
    return "1 active run"
  end
  return tostring(active) .. " active runs"
end

local function assess(trigger)
  local status = trigger.status
  if status == nil then
    return { status = "Progressing", message = "Waiting for the operator" }
  end
  local generation = trigger.metadata and trigger.metadata.generation
  local observed = status.observedGeneration
  if observed == nil then
    return { status = "Progressing", message = "Waiting for the operator" }
  end
  -- Until the operator has acted on the latest spec, the status describes an older one.
  if generation ~= nil and observed < generation then
    return { status = "Progressing", message = "Waiting for the operator to observe generation "
      .. tostring(generation) .. " (last observed " .. tostring(observed) .. ")" }
  end
  local ready = find_condition(status, "Ready")
  if trigger.spec ~= nil and trigger.spec.suspend == true then
    return { status = "Suspended", message = join("Suspended", ready and ready.message) }
  end
  if ready == nil then
    return { status = "Progressing", message = "Waiting for the operator" }
  end
  if ready.status == "True" then
    return { status = "Healthy", message = join(ready.reason, ready.message) .. "; " .. active_runs(status) }
  end
  if ready.status == "False" and ready.reason ~= "Provisioning" then
    return { status = "Degraded", message = join(ready.reason, ready.message) }
  end
  return { status = "Progressing", message = join(ready.reason, ready.message) }
end

return assess(obj)
