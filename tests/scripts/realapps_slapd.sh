#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: OpenLDAP's slapd (Debian's 2.5) in its packaged shape,
#   slapd -u openldap -g openldap -h ldap://127.0.0.1:PORT/ -f slapd.conf -d 0
# with a private slapd.conf and mdb database (rootdn/rootpw) made in the
# test's directory, and the ldap-utils clients: ldapadd of RA_LDAP_ENTRIES
# (50) inetOrgPerson entries in one connection, then ldapsearch of them back
# (the result must list exactly those entries, each with its description).
# slapd's liblber sets O_NONBLOCK on its connections through fcntl64 (glibc
# >= 2.28 with large-file support): fabsock, which once did not see that
# call, treated them as blocking and slapd hung in read() under ldapadd,
# every run (issue 26). Kernel mode first, then fabsock (slapd and the
# clients under the library), each bounded by timeouts. The clients run
# twice: as root (another user than slapd's openldap: shm cannot reach it,
# the connection stays on TCP: fallback_other_user) and as openldap
# (setpriv; the same user: the connections offload, which the stats lines,
# the nftables counter and slapd's own stats check). Every run: the clients
# exit 0 in time, the search returns the entries, slapd is alive after the
# load and stops on SIGTERM with status 0, no core file, no fabsock warning
# about lost bytes or resets.

. "$(dirname "$0")/realapps_lib.sh"

ra_need slapd ldapadd ldapsearch nft timeout setpriv
id openldap >/dev/null 2>&1 || fs_skip "no openldap user (apt-get install slapd)"
[ -r /etc/ldap/schema/inetorgperson.schema ] || fs_skip "no OpenLDAP schema files"
MODDIR=/usr/lib/ldap
[ -e "$MODDIR/back_mdb.so" ] || fs_skip "no $MODDIR/back_mdb.so"

ENTRIES=${RA_LDAP_ENTRIES:-50}
SUFFIX="dc=fabsock,dc=test"
ROOTDN="cn=admin,$SUFFIX"
ROOTPW="fabsock-secret"

# The entries to add and the search result expected (sorted dn/description).
LDIF=$RA_DIR/entries.ldif
{
	printf 'dn: %s\nobjectClass: dcObject\nobjectClass: organization\ndc: fabsock\no: fabsock test\n\n' "$SUFFIX"
	printf 'dn: ou=people,%s\nobjectClass: organizationalUnit\nou: people\n\n' "$SUFFIX"
	for i in $(seq 1 "$ENTRIES"); do
		printf 'dn: uid=user%d,ou=people,%s\nobjectClass: inetOrgPerson\nuid: user%d\ncn: User %d\nsn: Number%d\n' \
			"$i" "$SUFFIX" "$i" "$i" "$i"
		printf 'description: %s\n\n' "$(printf 'entry %d of fabsock issue 26' "$i" | sha256sum | cut -c1-48)"
	done
} >"$LDIF"
chmod 644 "$LDIF"
WANT=$RA_DIR/want.txt
awk '/^dn: uid=/ { dn = $2 } /^description: / { print dn, $2 }' "$LDIF" | sort >"$WANT"

# slapd_case MODE USER: a fresh database, slapd, ldapadd + ldapsearch as
# USER (root or openldap), the verdicts.
slapd_case() {
	local mode=$1 user=$2 label="$1 client=$2" dir port srv rc=0 got n so co pl p b
	local -a RA_AS
	dir=$RA_DIR/slapd-$mode-$user
	mkdir -p "$dir/db"
	chown -R openldap:openldap "$dir"
	cat >"$dir/slapd.conf" <<EOF
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
pidfile $dir/slapd.pid
argsfile $dir/slapd.args
modulepath $MODDIR
moduleload back_mdb
database mdb
maxsize 67108864
suffix "$SUFFIX"
rootdn "$ROOTDN"
rootpw $ROOTPW
directory $dir/db
EOF
	chmod 644 "$dir/slapd.conf"
	port=$(fs_free_port) || { fs_fail "$RA_CASE $label: no free port"; return; }
	ra_env "$mode" "slapd-$user"
	# -d 0: in the foreground (fs_bg's pid is slapd's), logging nothing
	fs_bg srv timeout -k 5 120 "${RA_ENV[@]}" slapd -u openldap -g openldap -h "ldap://127.0.0.1:$port/" \
		-f "$dir/slapd.conf" -d 0 >"$dir/slapd.out" 2>&1
	if ! ra_wait_listen "$port" "$srv" 20; then
		fs_fail "$RA_CASE $label: slapd did not listen on $port ($RA_LISTEN_WHY)"
		ra_tail 5 "$dir/slapd.out"
		return
	fi
	fs_tcp_count_start "$port" || fs_fail "$RA_CASE $label: nft counter not set up"
	ra_env "$mode" "client-$user"
	ra_as_argv "$user"
	timeout -k 2 30 "${RA_AS[@]}" "${RA_ENV[@]}" ldapadd -x -H "ldap://127.0.0.1:$port/" -D "$ROOTDN" \
		-w "$ROOTPW" -f "$LDIF" >"$dir/add.out" 2>&1 || rc=$?
	if [ "$rc" -ne 0 ]; then
		fs_fail "$RA_CASE $label: ldapadd exit $rc$([ "$rc" = 124 ] && echo ' (timed out: a hang)')"
		ra_tail 3 "$dir/add.out"
		ra_stacks_if_running "$srv" 0 slapd
	elif [ "$(grep -c '^adding new entry' "$dir/add.out")" != $((ENTRIES + 2)) ]; then
		fs_fail "$RA_CASE $label: ldapadd added $(grep -c '^adding new entry' "$dir/add.out") entries, expected $((ENTRIES + 2))"
	else
		fs_pass "$RA_CASE $label: ldapadd of $((ENTRIES + 2)) entries"
	fi
	rc=0
	timeout -k 2 30 "${RA_AS[@]}" "${RA_ENV[@]}" ldapsearch -x -LLL -o ldif-wrap=no -H "ldap://127.0.0.1:$port/" \
		-D "$ROOTDN" -w "$ROOTPW" -b "ou=people,$SUFFIX" '(objectClass=inetOrgPerson)' dn description \
		>"$dir/search.out" 2>&1 || rc=$?
	got=$(awk '/^dn: / { dn = $2 } /^description: / { print dn, $2 }' "$dir/search.out" | sort)
	n=$(printf '%s\n' "$got" | grep -c '^uid=' || true)
	if [ "$rc" -ne 0 ]; then
		fs_fail "$RA_CASE $label: ldapsearch exit $rc$([ "$rc" = 124 ] && echo ' (timed out: a hang)')"
		ra_tail 3 "$dir/search.out"
	elif [ "$got" != "$(cat "$WANT")" ]; then
		fs_fail "$RA_CASE $label: ldapsearch returned $n entries, not the $ENTRIES added (or other descriptions)"
	else
		fs_pass "$RA_CASE $label: ldapsearch returned the $ENTRIES entries, every description equal"
	fi
	read -r p b pl hs hsb odd _ < <(fs_tcp_count_read)
	fs_tcp_count_stop
	ra_alive "$mode" "$srv" "slapd"
	ra_stop "$mode" "$srv" SIGTERM slapd 20 "$dir/slapd.out" || true
	[ "$mode" = fabsock ] || { fs_log "$RA_CASE $label: TCP carried $pl payload bytes in $p segments"; return; }
	so=$(ra_sum "slapd-$user" "$mode" offloaded)
	co=$(ra_sum "client-$user" "$mode" offloaded)
	if [ "$user" = openldap ]; then
		# ldapadd and ldapsearch: a connection each, both offloaded
		if [ "$so" = 2 ] && [ "$co" = 2 ] && [ "$pl" = 0 ] && [ "$odd" = 0 ]; then
			fs_pass "$RA_CASE $label: both connections offloaded (slapd offloaded=$so, clients $co); TCP carried $pl payload bytes besides $hs handshake segments"
		else
			fs_fail "$RA_CASE $label: slapd offloaded=$so, clients offloaded=$co (expected 2 each), TCP payload $pl bytes besides the handshakes (want 0), $odd segments of unknown shape; clients: $(ra_why "client-$user" "$mode"); slapd: $(ra_why "slapd-$user" "$mode")"
		fi
	else
		# root's clients cannot reach openldap's shm: TCP, by design
		fs_log "$RA_CASE $label: slapd offloaded=$so, clients offloaded=$co, TCP carried $pl payload bytes (clients: $(ra_why "client-$user" "$mode"))"
		[ "$co" = 0 ] || fs_fail "$RA_CASE $label: a root client offloaded to openldap's slapd ($co)"
	fi
	ra_log_clean "slapd-$user" "$mode" || true
	ra_log_clean "client-$user" "$mode" || true
}

ra_cores_on
for mode in kernel fabsock; do
	for user in root openldap; do
		slapd_case "$mode" "$user"
	done
done
ra_cores_report "all runs"
ra_done
