;;; magent-store-redact.el --- Which secrets magent-store keeps out of its files  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; The redaction settings: which secrets the backend replaces by
;; [redacted:KIND] before anything is written (the session's log,
;; snapshot and header, the search index, the backend's log).  The
;; matching happens in the backend, never on Emacs's thread: this file
;; only says what to look for, as the spec the backend reads when it
;; opens a session (`magent-store-redact-spec-json').  What magent holds
;; in memory is unchanged; what comes back on resume is the redacted text.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'magent-store-json)

(declare-function auth-source-search "auth-source" (&rest spec))

(defgroup magent-store-redact nil
  "Keep secrets out of the files magent-store writes."
  :group 'magent-store
  :prefix "magent-store-redact")

(defcustom magent-store-redact nil
  "Which secrets magent-store replaces by [redacted:KIND] before it writes.
nil (the default): none, everything is stored exactly as magent holds
it.  t: every source.  Or a list of sources:
  `credentials'  well-known credentials (cloud and LLM provider keys,
                 GitHub, GitLab and Slack tokens, private keys, JSON web
                 tokens, Authorization headers), by gitleaks' rules;
  `auth-source'  the secrets of the `auth-source' entries that
                 `magent-store-redact-auth-sources' names;
  `patterns'     your own regular expressions,
                 `magent-store-redact-patterns'.
What magent holds in memory is unchanged: only the saved copy is
redacted, so a session resumed later shows [redacted:KIND] in place of
each secret.  The setting is read when a session is opened."
  :type '(choice (const :tag "Off" nil)
                 (const :tag "Every source" t)
                 (set :tag "Sources"
                      (const :tag "Well-known credentials" credentials)
                      (const :tag "Secrets of auth-source entries" auth-source)
                      (const :tag "Your regular expressions" patterns)))
  :group 'magent-store-redact)

(defcustom magent-store-redact-auth-sources nil
  "The `auth-source' entries whose secrets are redacted, as search specs.
Each element is a plist given to `auth-source-search', for example
\((:host \"api.openai.com\") (:host \"db.example.com\" :user \"admin\")).
The secrets found are handed to the backend when a session opens; they
are never logged or shown.  A secret shorter than 4 characters is left
out (it would redact ordinary words).  Used when `magent-store-redact'
is t or lists `auth-source'."
  :type '(repeat (plist :tag "auth-source search spec"))
  :group 'magent-store-redact)

(defcustom magent-store-redact-patterns nil
  "Your own secrets, as an alist of (KIND . REGEXP).
KIND names the secret in the [redacted:KIND] that replaces it: lower
case letters, digits and dashes.  REGEXP is in Python's syntax (the
backend matches it), not Emacs's: for example
\((\"ticket\" . \"TICKET-\\\\d{6}\")).  In streamed text a match must
lie within 256 characters without blanks to be caught across chunks.
Used when `magent-store-redact' is t or lists `patterns'."
  :type '(alist :key-type (string :tag "Kind") :value-type (string :tag "Python regexp"))
  :group 'magent-store-redact)

(defconst magent-store-redact--literal-min 4
  "The shortest secret from `auth-source' that is redacted.")

(defun magent-store-redact--on (source)
  "Non-nil when `magent-store-redact' asks for SOURCE."
  (or (eq magent-store-redact t) (memq source magent-store-redact)))

(defun magent-store-redact--secret (entry)
  "Return the secret of ENTRY, an `auth-source-search' result, or nil."
  (let ((secret (plist-get entry :secret)))
    (when (functionp secret)
      (setq secret (funcall secret)))
    (and (stringp secret)
         (>= (length secret) magent-store-redact--literal-min)
         (substring-no-properties secret))))

(defun magent-store-redact--literals ()
  "Return the secrets of the entries `magent-store-redact-auth-sources' names."
  (require 'auth-source)
  (let (secrets)
    (dolist (spec magent-store-redact-auth-sources)
      (dolist (entry (apply #'auth-source-search (append spec '(:max 50))))
        (when-let ((secret (magent-store-redact--secret entry)))
          (cl-pushnew secret secrets :test #'equal))))
    (nreverse secrets)))

(defun magent-store-redact-spec ()
  "Return the redaction spec `magent-store-redact' asks for, or nil when off.
An alist: `rules' (the well-known credentials, t or `:json-false'),
`patterns' (kind . regexp) and `literals' (a vector of secrets)."
  (when magent-store-redact
    `((rules . ,(if (magent-store-redact--on 'credentials) t :json-false))
      (patterns . ,(if (magent-store-redact--on 'patterns)
                       (mapcar (lambda (pair) (cons (intern (car pair)) (cdr pair)))
                               magent-store-redact-patterns)
                     :empty-object))
      (literals . ,(vconcat (and (magent-store-redact--on 'auth-source)
                                 (magent-store-redact--literals)))))))

(defun magent-store-redact-spec-json ()
  "Return the redaction spec as JSON text, or nil when redaction is off.
The backend takes it in a session's open options, and
`magent-store export --redact-spec -' reads it.  It holds the secrets
of `magent-store-redact-auth-sources': never log or show it."
  (when-let ((spec (magent-store-redact-spec)))
    (let ((patterns (alist-get 'patterns spec)))
      (when (eq patterns :empty-object)
        (setf (alist-get 'patterns spec) (make-hash-table :test #'equal))))
    (magent-store-json-encode spec)))

(provide 'magent-store-redact)
;;; magent-store-redact.el ends here
