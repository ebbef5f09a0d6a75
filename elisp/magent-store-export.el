;;; magent-store-export.el --- A past magent session as an Org or Markdown buffer  -*- lexical-binding: t; -*-

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

;; M-x magent-store-export-session opens a session as an Org buffer (with
;; a prefix argument, Markdown): the session on the current line of the
;; search results, the one magent's buffer shows, or else one read with
;; `magent-store-find-read-session'.  The document is written by a
;; separate `magent-store export --format' process, so Emacs stays free
;; while it runs; the buffer visits no file (C-x C-w saves it).  With
;; redaction on, the secrets are replaced in the document, never in the
;; session.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store)
(require 'magent-store-layout)
(require 'magent-store-search)
(require 'magent-store-find)

(declare-function magent-store-redact-spec-json "magent-store-redact" ())
(declare-function magent-store-magent-session-id "magent-store-magent" (&optional buffer))
(declare-function markdown-mode "ext:markdown-mode" ())

;;;; Which session

(defun magent-store-export--by-id (id)
  "Return session ID under the session root as a hit, or nil when it has no file."
  (when (and (stringp id) (string-match-p "\\`[A-Za-z0-9][A-Za-z0-9_.-]*\\'" id))
    (let ((root (file-name-as-directory (magent-store-session-root))))
      (when-let* ((header
                   (cl-some (lambda (directory)
                              (let ((file (magent-store-session-file 'header id directory)))
                                (and (file-exists-p file) file)))
                            (magent-store-scope-directory '* root))))
        `((id . ,id) (header . ,header) (root . ,root))))))

(defun magent-store-export--session-here ()
  "Return the session the current buffer is about as a hit, or nil.
That is the search result on the current line, or the session magent's
buffer shows; a session magent has not saved yet is an error."
  (cond
   ((derived-mode-p 'magent-store-search-mode)
    (or (tabulated-list-get-id) (user-error "No session on this line")))
   ((when-let* ((id (and (fboundp 'magent-store-magent-session-id)
                         (magent-store-magent-session-id))))
      (or (magent-store-export--by-id id)
          (user-error "Session %s has not been saved yet" id))))))

;;;; The document

(defun magent-store-export--redaction ()
  "Return the redaction spec (JSON text) when redaction is on, else nil."
  (and (boundp 'magent-store-redact)
       (symbol-value 'magent-store-redact)
       (fboundp 'magent-store-redact-spec-json)
       (let ((spec (magent-store-redact-spec-json)))
         ;; Emacs 30's `json-serialize' gives UTF-8 bytes.
         (if (multibyte-string-p spec) spec (decode-coding-string spec 'utf-8)))))

(defun magent-store-export--buffer-name (hit markdown text)
  "Return a name for TEXT, the document of HIT (Markdown when MARKDOWN).
It is the session's title: HIT's, else the document's, else its id."
  (let ((title (or (alist-get 'title hit)
                   (and (string-match (if markdown "^# \\(.+\\)$" "^#\\+title: \\(.+\\)$")
                                      text)
                        (match-string 1 text)))))
    (concat (if (and (stringp title) (not (string-blank-p title)))
                (truncate-string-to-width
                 (string-trim (replace-regexp-in-string "[\n\r\t/\\]+" " " title)) 60)
              (alist-get 'id hit))
            (if markdown ".md" ".org"))))

(defun magent-store-export--show (hit markdown text)
  "Return a new buffer holding TEXT, HIT's document, in Org (or MARKDOWN) mode."
  (let ((buffer (generate-new-buffer (magent-store-export--buffer-name hit markdown text))))
    (with-current-buffer buffer
      (insert text)
      (cond ((not markdown) (org-mode))
            ((fboundp 'markdown-mode) (markdown-mode))
            (t (text-mode)))
      (goto-char (point-min))
      (set-buffer-modified-p nil))
    buffer))

(defun magent-store-export--stderr (buffer)
  "Return what the process writing into BUFFER said, once it has said all."
  (when-let* ((process (get-buffer-process buffer)))
    (with-timeout (2 nil)
      (while (process-live-p process)
        (accept-process-output process 0.05))))
  (string-trim (with-current-buffer buffer (buffer-string))))

(defun magent-store-export--sentinel (process _event)
  "Open PROCESS's document once it has exited, or say why it failed."
  (unless (process-live-p process)
    (pcase-let ((`(,hit ,markdown ,errors) (process-get process 'magent-store-export))
                (output (process-buffer process)))
      (unwind-protect
          (if (and (eq (process-status process) 'exit)
                   (eq (process-exit-status process) 0))
              (let ((buffer (magent-store-export--show
                             hit markdown (with-current-buffer output (buffer-string)))))
                (process-put process 'magent-store-export-buffer buffer)
                (pop-to-buffer buffer))
            (let ((why (replace-regexp-in-string
                        "^magent-store: \\(error: \\)?" ""
                        (magent-store-export--stderr errors))))
              (process-put process 'magent-store-export-error why)
              (message "Cannot export session %s: %s" (alist-get 'id hit)
                       (if (string-empty-p why)
                           (format "exit status %s" (process-exit-status process))
                         why))))
        (kill-buffer output)
        (when (buffer-live-p errors)
          (let ((process (get-buffer-process errors)))
            (when process (delete-process process)))
          (kill-buffer errors))))))

;;;###autoload
(defun magent-store-export-session (hit &optional markdown)
  "Open the session HIT as an Org buffer; as Markdown with MARKDOWN.
Interactively: the session on the current line of the search results,
the one magent's buffer shows, or else one read from the minibuffer;
a prefix argument asks for Markdown.  HIT is an alist holding the
session's header file (`header') and id, as search results and
`magent-store-find-read-session' give.  The document is written by a
separate process: return it at once; the buffer (which visits no file:
\\[write-file] saves it) appears when it is done.  With redaction on,
secrets are replaced in the document (the session is not changed)."
  (interactive
   (list (or (magent-store-export--session-here)
             (magent-store-find-read-session "Export session: "))
         current-prefix-arg))
  (let ((header (alist-get 'header hit)))
    (unless (and (stringp header) (file-regular-p header))
      (user-error "No session %s: no file %s" (alist-get 'id hit) header))
    (let* ((spec (magent-store-export--redaction))
           (command (apply #'magent-store-search--command
                           "export" header "--format" (if markdown "markdown" "org")
                           (and spec '("--redact" "--redact-spec" "-"))))
           (errors (generate-new-buffer " *magent-store-export-errors*"))
           (process (make-process
                     :name "magent-store-export"
                     :buffer (generate-new-buffer " *magent-store-export*")
                     :stderr errors
                     :command command
                     :coding 'utf-8
                     :connection-type 'pipe
                     :noquery t
                     :sentinel #'magent-store-export--sentinel)))
      (process-put process 'magent-store-export (list hit markdown errors))
      (when spec
        (process-send-string process spec))
      (process-send-eof process)
      process)))

(provide 'magent-store-export)
;;; magent-store-export.el ends here
