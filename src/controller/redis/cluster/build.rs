//! Pure builders of a Cluster Redis's children: one StatefulSet per shard
//! (`<name>-s<i>`, pods `<name>-s<i>-<j>`), a client Service over every
//! node, and the start-up script with the Cluster-mode boot rule.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ContainerPort, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::v1alpha1::{Engine, Redis};
use crate::controller::names::{
    self, AUTH_CONF_PATH, CONFIG_KEY, Names, PROBE_USER, REDIS_PORT, SERVER_CONTAINER,
    selector_labels, stamp_hash,
};
use crate::controller::redis::statefulset::{self, MAXMEMORY_CAP};

/// Pod label naming the shard an instance belongs to.
pub const SHARD_LABEL: &str = "redpilot.io/shard";
/// The cluster bus port: the client port + 10,000, the engines' default.
pub const BUS_PORT: u16 = REDIS_PORT + 10_000;
/// `cluster-node-timeout`, in milliseconds: how long a node may not answer
/// before the others count it failing. Measured (Valkey 8.1, 3 x 2, see
/// `docs/cluster-mode-design.md`): a shard primary `kill -9` to its replica
/// taking writes in p50 2.40 s / max 2.79 s at 1000 ms, and 3.70 s / 4.01 s
/// at 2000 ms. Lower would fail over on a one-second pause (a fork of a
/// large dataset, a slow disk).
pub const NODE_TIMEOUT_MS: u32 = 1000;
/// How long a node that served slots and had replicas waits at start-up
/// for the cluster to hand its slots to a replica (see [`start_script`]).
pub const TAKEOVER_WAIT_SECS: u32 = 30;
/// The variable set (from the ConfigMap) while a Redis wakes from
/// hibernation.
pub const WAKING_ENV: &str = "REDPILOT_WAKING";

/// The StatefulSet of shard `shard`.
pub fn shard_statefulset_name(names: &Names, shard: i32) -> String {
    format!("{}-s{shard}", names.base)
}

/// The first instance of shard `shard` (`<name>-s<i>-0`): where a
/// restored shard's file is loaded.
pub fn first_of_shard(names: &Names, shard: i32) -> String {
    format!("{}-0", shard_statefulset_name(names, shard))
}

/// The shard a pod belongs to, from its name (`<name>-s<i>-<j>`).
pub fn shard_of(names: &Names, pod: &str) -> Option<(i32, i32)> {
    let rest = pod.strip_prefix(&names.base)?.strip_prefix("-s")?;
    let (s, o) = rest.split_once('-')?;
    Some((s.parse().ok()?, o.parse().ok()?))
}

/// Whether `pod` belongs to one of the first `shards` shards, the ones the
/// spec keeps (a shard past them is one a resharding empties and removes:
/// its StatefulSet is no longer applied, so it keeps its template and
/// leaves with its pods).
pub fn in_kept_shard(names: &Names, pod: &str, shards: i32) -> bool {
    shard_of(names, pod).is_some_and(|(s, _)| s < shards)
}

/// The start-up script of a Cluster node. The node announces its pod IP.
///
/// Boot rule: a node whose `nodes.conf` says it served slots and had
/// replicas does not start serving at once. Coming back within the node
/// timeout, it would still be the shard's primary with whatever its data
/// directory holds (nothing without persistence, an older snapshot with
/// it), and its replicas would resynchronise from it and drop the writes
/// they hold. It first waits, port closed, until a peer reports that its
/// slots went to another node (the cluster elected a replica), then starts
/// with its own `nodes.conf` line rewritten to what the peer reports (no
/// slots; a replica of the new primary), so it never answers for the slots
/// it lost while gossip catches up; for at most
/// [`TAKEOVER_WAIT_SECS`] (when no replica can take over, e.g. all nodes
/// restart at once, the node starts with what it has). A Redis waking from
/// hibernation ([`WAKING_ENV`] set) skips the wait: every instance saved
/// the same data with writes paused, so no replica holds newer writes. The
/// exemption holds once per node and wake (a marker beside `nodes.conf`
/// records the wake it started for): a node that restarts later in the
/// same wake (its peers woke, took writes and replicated them while
/// another pod still waited to be scheduled) follows the rule again, or it
/// would come back as primary with the hibernation-time data and its
/// replica would resync from it.
///
/// With `spec.tls` (`tls`: the CLI's flags, from
/// [`crate::controller::layout::cli_flags`]) the peers are asked over
/// TLS, their certificates checked against the mounted `ca.crt`. While
/// TLS is turned on or off (`other`: the flags of the other way, from
/// [`crate::controller::layout::either_flags`]) a peer that does not
/// answer one way is asked the other: once the servers are switched live,
/// they listen the way the pod's template does not, and a node restarted
/// then would otherwise hear no peer and start as primary after the bound.
pub fn start_script(engine: Engine, tls: &str, other: Option<&str>, pitr: &str) -> String {
    let (server, cli) = match engine {
        Engine::Redis => ("redis-server", "redis-cli"),
        Engine::Valkey => ("valkey-server", "valkey-cli"),
    };
    let ask = |flags: &str| {
        format!(
            r#"$(REDISCLI_AUTH="${{REDPILOT_PROBE_PASSWORD:-}}" VALKEYCLI_AUTH="${{REDPILOT_PROBE_PASSWORD:-}}" timeout 2 {cli}{flags} $u -h "${{p%:*}}" -p "${{p##*:}}" cluster nodes 2>/dev/null | tr -d '\r' | awk -v me="$me" '$1 == me {{print NF, $3, $4}}') || seen="#
        )
    };
    let mut query = format!("seen={}", ask(tls));
    if let Some(other) = other {
        query.push_str(&format!(
            "\n        [ -n \"$seen\" ] || seen={}",
            ask(other)
        ));
    }
    format!(
        r#"set -eu
umask 077
printf '%s' "${{REDIS_AUTH_CONF:-}}" > {AUTH_CONF_PATH}
set -- /etc/redis/{CONFIG_KEY} --cluster-announce-ip "$POD_IP"
conf=/data/nodes.conf
if [ -s "$conf" ]; then
  me=$(awk '$3 ~ /myself/ {{print $1; exit}}' "$conf")
  served=$(awk '$3 ~ /myself/ && $3 ~ /master/ && NF > 8 {{print "yes"; exit}}' "$conf")
  followers=$(awk -v me="$me" '$4 == me {{n++}} END {{print n+0}}' "$conf")
  woke="${{conf%/*}}/redpilot-woke"
  if [ -n "${{{WAKING_ENV}:-}}" ] && [ "$(cat "$woke" 2>/dev/null)" != "${{{WAKING_ENV}}}" ]; then
    printf '%s' "${{{WAKING_ENV}}}" > "$woke"
    echo "redpilot: waking from hibernation (saved ${{{WAKING_ENV}}}): every instance saved the same data; starting at once" >&2
  elif [ -n "$me" ] && [ "$served" = yes ] && [ "$followers" -gt 0 ]; then
    peers=$(awk '$3 !~ /myself/ && $3 !~ /noaddr/ {{split($2, a, "@"); print a[1]}}' "$conf")
    u=; [ -n "${{REDPILOT_PROBE_PASSWORD:-}}" ] && u="--user {PROBE_USER}"
    echo "redpilot: this node served slots and had replicas: waiting until the cluster hands its slots to a replica (at most {TAKEOVER_WAIT_SECS} s)" >&2
    end=$(( $(date +%s) + {TAKEOVER_WAIT_SECS} ))
    taken=
    while [ -z "$taken" ] && [ "$(date +%s)" -lt "$end" ]; do
      for p in $peers; do
        {query}
        n=${{seen%% *}}
        if [ -n "$n" ] && [ "$n" -le 8 ]; then
          taken=yes
          # The peer shows this node as a replica of the new primary, or
          # as a failed primary without slots.
          case "$seen" in *slave*|*replica*) primary=${{seen##* }} ;; *) primary=- ;; esac
          break
        fi
      done
      [ -n "$taken" ] || sleep 1
    done
    if [ -n "$taken" ]; then
      # Start as what the cluster made of this node: no slots, and a
      # replica of the new primary when the peer named one. Started with
      # its old line, the node would answer as the primary of the slots it
      # lost, with its empty data, until gossip corrected it.
      if [ "$primary" = - ]; then flags=myself,master; else flags=myself,slave; fi
      awk -v me="$me" -v f="$flags" -v p="$primary" '$1 == me {{print $1, $2, f, p, $5, $6, $7, $8; next}} $1 == p {{print $1, $2, "master", "-", $5, $6, $7, $8; next}} {{print}}' "$conf" > "$conf.new" && mv "$conf.new" "$conf"
      echo "redpilot: the cluster moved this node's slots to a replica; starting without them, to rejoin as a replica (of ${{primary}})" >&2
    else
      echo "redpilot: no peer reported a takeover within {TAKEOVER_WAIT_SECS} s; starting with the data on disk" >&2
    fi
  fi
fi
{pitr}{MAXMEMORY_CAP}
exec {server} "$@"
"#
    )
}

/// The StatefulSet of one shard: the common pod template, `instances`
/// pods, the shard label on pods and selector, the cluster bus port, the
/// Cluster start script, and anti-affinity between the shard's own pods.
pub fn shard_statefulset(
    redis: &Redis,
    names: &Names,
    shard: i32,
    secret_name: &str,
    restart: &str,
    image: &str,
    memory_limit: Option<u64>,
) -> StatefulSet {
    let mut sts = statefulset::statefulset(redis, names, secret_name, restart, image, memory_limit);
    let shard_value = shard.to_string();
    sts.metadata.name = Some(shard_statefulset_name(names, shard));
    sts.spec.replicas = Some(redis.spec.desired_instances());
    let mut sel = selector_labels(redis);
    sel.insert(SHARD_LABEL.into(), shard_value.clone());
    sts.spec.selector.match_labels = Some(sel.clone());
    if let Some(claims) = sts.spec.volume_claim_templates.as_mut() {
        for c in claims {
            c.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(SHARD_LABEL.into(), shard_value.clone());
        }
    }
    let template = &mut sts.spec.template;
    if let Some(meta) = template.metadata.as_mut() {
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(SHARD_LABEL.into(), shard_value.clone());
    }
    if let Some(pod) = template.spec.as_mut() {
        // Preferred anti-affinity among the shard's own pods: a primary and
        // its replicas on different nodes where the scheduler allows.
        let user_affinity = redis
            .spec
            .pod_template
            .as_ref()
            .and_then(|t| t.affinity.as_ref())
            .is_some();
        if !user_affinity
            && let Some(terms) = pod
                .affinity
                .as_mut()
                .and_then(|a| a.pod_anti_affinity.as_mut())
                .and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_mut()
                })
        {
            for t in terms {
                if let Some(ls) = t.pod_affinity_term.label_selector.as_mut() {
                    ls.match_labels = Some(sel.clone());
                }
            }
        }
        if let Some(c) = pod
            .containers
            .iter_mut()
            .find(|c| c.name == SERVER_CONTAINER)
        {
            c.command = Some(vec![
                "sh".into(),
                "-c".into(),
                start_script(
                    redis.spec.engine(),
                    &crate::controller::layout::cli_flags(redis, true),
                    crate::controller::layout::either_flags(redis).as_deref(),
                    &statefulset::pitr_clause(&redis.spec),
                ),
            ]);
            c.env
                .get_or_insert_with(Vec::new)
                .push(statefulset::config_env(
                    names,
                    WAKING_ENV,
                    names::WAKING_KEY,
                ));
            c.ports.get_or_insert_with(Vec::new).push(ContainerPort {
                name: Some("cluster-bus".into()),
                container_port: i32::from(BUS_PORT),
                protocol: Some("TCP".into()),
                ..Default::default()
            });
        }
        crate::controller::redis::archive::for_shard(pod, shard);
    }
    names::stamp_hash(sts)
}

/// The Services: headless (stable pod names, every node), and the client
/// Service (`<name>`) over every node, where cluster-aware clients find
/// the cluster and are redirected (`MOVED`) to the node of each slot.
pub fn services(redis: &Redis, names: &Names) -> Vec<Service> {
    let sel = selector_labels(redis);
    let port = |name: &str, p: u16, target: &str| ServicePort {
        name: Some(name.to_string()),
        port: i32::from(p),
        target_port: Some(IntOrString::String(target.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    vec![
        Service {
            metadata: names::meta(redis, names.headless()),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                publish_not_ready_addresses: Some(true),
                selector: Some(sel.clone()),
                ports: Some(vec![
                    port("redis", REDIS_PORT, "redis"),
                    port("cluster-bus", BUS_PORT, "cluster-bus"),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Service {
            metadata: names::meta(redis, names.write_service()),
            spec: Some(ServiceSpec {
                selector: Some(sel),
                ports: Some(vec![port("redis", REDIS_PORT, "redis")]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
    .into_iter()
    .map(stamp_hash)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{Mode, RedisSpec};
    use crate::controller::redis::build::test_redis;

    fn cluster() -> Redis {
        test_redis(RedisSpec {
            mode: Some(Mode::Cluster),
            shards: Some(3),
            ..Default::default()
        })
    }

    #[test]
    fn a_shard_past_the_spec_is_not_kept() {
        let names = Names::new("cache");
        assert!(in_kept_shard(&names, "cache-s0-1", 3));
        assert!(in_kept_shard(&names, "cache-s2-0", 3));
        // The 4th shard, which a resharding to 3 empties and removes.
        assert!(!in_kept_shard(&names, "cache-s3-0", 3));
        assert!(in_kept_shard(&names, "cache-s3-0", 4));
        // Another Redis's pod, or no shard pod at all.
        assert!(!in_kept_shard(&names, "cachex-s0-0", 3));
        assert!(!in_kept_shard(&names, "cache-0", 3));
    }

    #[test]
    fn each_shard_selects_only_its_pods() {
        let r = cluster();
        let names = Names::new("cache");
        let sts = shard_statefulset(&r, &names, 2, "s", "h", "img", None);
        assert_eq!(sts.metadata.name.as_deref(), Some("cache-s2"));
        assert_eq!(sts.spec.replicas, Some(2));
        let sel = sts.spec.selector.match_labels.clone().unwrap_or_default();
        assert_eq!(sel.get(SHARD_LABEL).map(String::as_str), Some("2"));
        let pod_labels = sts
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        assert!(sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        let pod = sts.spec.template.spec.as_ref().expect("pod spec");
        let c = &pod.containers[0];
        let script = c.command.as_ref().map(|c| c[2].clone()).unwrap_or_default();
        assert!(script.contains("--cluster-announce-ip"));
        assert!(!script.contains("--replicaof"));
        assert!(c.ports.iter().flatten().any(|p| p.container_port == 16379));
        assert_eq!(shard_of(&names, "cache-s12-1"), Some((12, 1)));
        assert_eq!(shard_of(&names, "cache-1"), None);
    }

    /// A resharding changes `spec.shards` only: the shards that stay keep
    /// their StatefulSet as it was (a change would restart every pod).
    #[test]
    fn the_shard_count_is_not_part_of_a_shards_statefulset() {
        let names = Names::new("cache");
        let mut four = cluster();
        four.spec.shards = Some(4);
        let a = serde_json::to_value(shard_statefulset(
            &cluster(),
            &names,
            1,
            "s",
            "h",
            "img",
            None,
        ));
        let b = serde_json::to_value(shard_statefulset(&four, &names, 1, "s", "h", "img", None));
        assert_eq!(a.ok(), b.ok());
        let restart = |r: &Redis| crate::controller::redis::conf::restart_hash(r, |_| false);
        assert_eq!(restart(&cluster()), restart(&four));
    }

    /// The server container of shard 0's StatefulSet.
    fn server_container(r: &Redis) -> k8s_openapi::api::core::v1::Container {
        let sts = shard_statefulset(r, &Names::new("cache"), 0, "s", "", "valkey", None);
        let pod = sts.spec.template.spec.expect("pod");
        pod.containers
            .into_iter()
            .find(|c| c.name == SERVER_CONTAINER)
            .expect("server")
    }

    #[test]
    fn with_tls_the_boot_rule_asks_its_peers_over_tls() {
        let tls = start_script(
            Engine::Valkey,
            " --tls --cacert /etc/redis-tls/ca.crt",
            None,
            "",
        );
        assert!(
            tls.contains(
                "timeout 2 valkey-cli --tls --cacert /etc/redis-tls/ca.crt $u -h \"${p%:*}\""
            ),
            "{tls}"
        );
        let plain = start_script(Engine::Valkey, "", None, "");
        assert!(!plain.contains("--tls"), "{plain}");
        // The mounted CA is where the TLS volume puts it.
        let r = test_redis(RedisSpec {
            mode: Some(Mode::Cluster),
            tls: Some(crate::api::v1alpha1::TlsSpec::default()),
            ..Default::default()
        });
        let server = server_container(&r);
        let script = server.command.clone().unwrap_or_default().join(" ");
        assert!(
            script.contains("--tls --cacert /etc/redis-tls/ca.crt $u")
                && !script.contains("--cert"),
            "{script}"
        );
        assert!(
            server
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/etc/redis-tls"),
            "{server:?}"
        );
    }

    #[test]
    fn when_clients_need_certificates_the_boot_rule_presents_its_own() {
        let r = test_redis(RedisSpec {
            mode: Some(Mode::Cluster),
            tls: Some(crate::api::v1alpha1::TlsSpec {
                client_auth: Some(crate::api::v1alpha1::ClientAuth::Required),
                ..Default::default()
            }),
            ..Default::default()
        });
        let script = server_container(&r).command.unwrap_or_default().join(" ");
        assert!(
            script.contains(
                "--tls --cacert /etc/redis-tls/ca.crt --cert /etc/redis-tls/tls.crt --key /etc/redis-tls/tls.key $u"
            ),
            "{script}"
        );
    }

    /// Runs the boot rule of `script` (a [`start_script`]) with a real
    /// shell on `conf` as `nodes.conf` in `dir`, with a 3 s bound (`date
    /// +%s` counts whole seconds, so the wait lasts between 2 and 3 s);
    /// `peer`: a shell function body that stands for every peer's
    /// `redis-cli` (its arguments are the flags; none: no peer answers).
    /// The output (stdout then stderr) and how long it took.
    fn run_boot_rule(
        dir: &std::path::Path,
        script: String,
        conf: &str,
        waking: &str,
        peer: Option<&str>,
    ) -> (String, std::time::Duration) {
        std::fs::write(dir.join("nodes.conf"), conf).expect("write");
        let script = script
            .replace(
                "/data/nodes.conf",
                &dir.join("nodes.conf").to_string_lossy(),
            )
            .replace(AUTH_CONF_PATH, &dir.join("auth").to_string_lossy())
            .replace("30 ))", "3 ))")
            .replace("exec redis-server", "echo started");
        let script = match peer {
            Some(body) => format!(
                "peer() {{ {body}; }}\n{}",
                script.replace("timeout 2 redis-cli", "peer")
            ),
            None => script,
        };
        let t = std::time::Instant::now();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("POD_IP", "127.0.0.1")
            .env(WAKING_ENV, waking)
            .env("REDPILOT_CGROUP_FILE", "/dev/null")
            .output()
            .expect("sh");
        (
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
            t.elapsed(),
        )
    }

    /// While TLS is turned on or off, a peer switched live listens the way
    /// the pod's template does not: the boot rule asks each peer the other
    /// way too, and hears the takeover at once; asked one way only, it
    /// hears nobody and starts with its data after the bound.
    #[test]
    fn during_a_tls_flip_the_boot_rule_asks_each_peer_both_ways() {
        let dir = std::env::temp_dir().join(format!("redpilot-flip-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let me = "a000000000000000000000000000000000000000";
        let other = "b000000000000000000000000000000000000000";
        let conf = format!(
            "{me} 127.0.0.1:1@11 myself,master - 0 0 1 connected 0-5460\n\
             {other} 127.0.0.1:2@12 slave {me} 0 0 1 connected\n"
        );
        let view = format!(
            "{me} 127.0.0.1:1@11 slave {other} 0 0 1 disconnected\n\
             {other} 127.0.0.1:2@12 myself,master - 0 0 2 connected 0-5460"
        );
        // The peer listens with TLS only.
        let peer = format!("[ \"${{1:-}}\" = --tls ] && printf '%s\\n' '{view}'");
        let run = |either: Option<&str>| {
            let script = start_script(Engine::Redis, "", either, "");
            run_boot_rule(&dir, script, &conf, "", Some(&peer))
        };
        let (out, took) = run(Some(" --tls --insecure"));
        assert!(
            out.contains("starting without them") && out.contains("started"),
            "{out}"
        );
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        let (out, took) = run(None);
        assert!(out.contains("no peer reported a takeover"), "{out}");
        assert!(took >= std::time::Duration::from_secs(2), "{took:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The boot rule, run with a real shell on `nodes.conf` samples: a
    /// node that served slots with replicas waits (and gives up after the
    /// bound); one without replicas or without slots starts at once.
    #[test]
    fn boot_rule_waits_only_for_a_primary_with_replicas() {
        let dir = std::env::temp_dir().join(format!("redpilot-boot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let me = "a000000000000000000000000000000000000000";
        let other = "b000000000000000000000000000000000000000";
        let primary_with_replica = format!(
            "{me} 127.0.0.1:1@11 myself,master - 0 0 1 connected 0-5460\n\
             {other} 127.0.0.1:2@12 slave {me} 0 0 1 connected\nvars currentEpoch 1\n"
        );
        let lone_primary = format!("{me} 127.0.0.1:1@11 myself,master - 0 0 1 connected 0-5460\n");
        let replica = format!(
            "{me} 127.0.0.1:1@11 myself,slave {other} 0 0 1 connected\n\
             {other} 127.0.0.1:2@12 master - 0 0 1 connected 0-5460\n"
        );
        // `peers`: the `CLUSTER NODES` every peer answers (none answers
        // without it).
        let run_peers = |conf: &str, waking: &str, peers: Option<&str>| {
            let peer = peers.map(|view| format!("printf '%s\\n' '{view}'"));
            let script = start_script(Engine::Redis, "", None, "");
            run_boot_rule(&dir, script, conf, waking, peer.as_deref())
        };
        let run_with = |conf: &str, waking: &str| run_peers(conf, waking, None);
        let run = |conf: &str| run_with(conf, "");
        // Waking from hibernation (every instance saved): no wait.
        let (out, took) = run_with(&primary_with_replica, "2026-11-28T16:00:00Z");
        assert!(out.contains("waking from hibernation"), "{out}");
        assert!(!out.contains("waiting") && out.contains("started"), "{out}");
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        // The same node restarting later in the same wake: the rule again.
        let (out, took) = run_with(&primary_with_replica, "2026-11-28T16:00:00Z");
        assert!(!out.contains("waking from hibernation"), "{out}");
        assert!(out.contains("waiting until the cluster hands"), "{out}");
        assert!(took >= std::time::Duration::from_secs(2), "{took:?}");
        // The next wake exempts it once more.
        let (out, _) = run_with(&primary_with_replica, "2026-12-01T08:00:00Z");
        assert!(out.contains("waking from hibernation"), "{out}");
        let (out, took) = run(&primary_with_replica);
        assert!(out.contains("waiting until the cluster hands"), "{out}");
        assert!(!out.contains("waking from hibernation"), "{out}");
        assert!(out.contains("no peer reported a takeover"), "{out}");
        assert!(out.contains("started"), "{out}");
        assert!(took >= std::time::Duration::from_secs(2), "{took:?}");
        // A peer reports the takeover: the node starts at once, its line
        // rewritten to a slotless replica of the new primary.
        let peer_view = format!(
            "{me} 127.0.0.1:1@11 master,fail - 0 0 1 disconnected\n\
             {other} 127.0.0.1:2@12 myself,master - 0 0 2 connected 0-5460"
        );
        let replaced = peer_view.replace("master,fail -", &format!("slave {other}"));
        for (view, flags, primary) in [
            (replaced.as_str(), "myself,slave", other),
            (peer_view.as_str(), "myself,master", "-"),
        ] {
            let (out, took) = run_peers(&primary_with_replica, "", Some(view));
            assert!(took < std::time::Duration::from_secs(2), "{took:?}");
            assert!(
                out.contains("starting without them") && out.contains("started"),
                "{out}"
            );
            let conf = std::fs::read_to_string(dir.join("nodes.conf")).expect("read");
            let mine = conf.lines().find(|l| l.starts_with(me)).unwrap_or_default();
            assert_eq!(
                mine,
                format!("{me} 127.0.0.1:1@11 {flags} {primary} 0 0 1 connected"),
                "{conf}"
            );
            // The new primary's line no longer names this node as its
            // primary (gossip brings its slots).
            let theirs = conf
                .lines()
                .find(|l| l.starts_with(other))
                .unwrap_or_default();
            let want = if primary == "-" {
                format!("{other} 127.0.0.1:2@12 slave {me} 0 0 1 connected")
            } else {
                format!("{other} 127.0.0.1:2@12 master - 0 0 1 connected")
            };
            assert_eq!(theirs, want, "{conf}");
            assert!(conf.contains("vars currentEpoch 1"), "{conf}");
        }
        for conf in [lone_primary, replica] {
            let (out, took) = run(&conf);
            assert!(!out.contains("waiting"), "{out}");
            assert!(out.contains("started"), "{out}");
            assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
